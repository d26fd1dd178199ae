"""torch's own backend suite (distributed_test.py) on the ftcomm backend, beside gloo in the same
run (tests/torch_suite_runner.py, tests/jobs/torch_suite.py).

By default a representative part: collectives and their group forms, subgroups, timeouts,
point-to-point, object collectives, coalescing, sparse allreduce, DDP, and torch's CUDA-only
reduce_scatter_tensor / all_gather_into_tensor tests adapted to CPU, at 2 and 3 ranks, all in one
job per backend; a few of them also with a fresh job per test. Behind ``-m torch_suite``: every
test of the suite, both ways, at 2 and 3 ranks (about 15 minutes).

Each test must end on ftcomm as it ends on gloo, except where ftcomm does better than gloo (it
passes what gloo cannot run) and the differences in ``KNOWN``, each with its reason.
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's distributed_test imports it

import torch_suite_runner as runner  # noqa: E402

REPRESENTATIVE = [
    "test_get_backend", "test_destroy_group", "test_new_subgroups", "test_new_subgroups_by_enumeration",
    "test_barrier_timeout_global", "test_barrier_timeout_full_group", "test_barrier", "test_barrier_group",
    "test_all_reduce_sum", "test_all_reduce_product", "test_all_reduce_group_max", "test_all_reduce_sum_complex",
    "test_all_reduce_coalesced_sum", "test_sparse_all_reduce_sum", "test_broadcast", "test_broadcast_group",
    "test_reduce_sum", "test_reduce_group_min", "test_gather", "test_gather_group", "test_scatter",
    "test_scatter_full_group", "test_all_gather", "test_all_gather_group", "test_all_gather_coalesced_simple",
    "test_all_to_all_single_unequal_split", "test_all_to_all_single_equal_split_group", "test_coalescing_manager", "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag",
    "test_isend", "test_irecv", "test_batch_isend_irecv_gloo_tags", "test_all_gather_object_subgroup",
    "test_gather_object", "test_scatter_object_list", "test_broadcast_object_list",
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync", "test_ddp_grad_div_uneven_inputs",
    # last: gloo fails these (its process may not survive them intact), ftcomm passes them
    "test_all_to_all", "test_reduce_scatter_tensor_cpu", "test_all_gather_into_cat_tensor_cpu",
    "test_all_gather_into_stack_tensor_cpu",
]
FRESH_JOB = ["test_get_backend", "test_barrier_timeout_full_group", "test_all_to_all_single_unequal_split",
             "test_send_recv_any_source", "test_DistributedDataParallelCPU"]
# Tests that pass on gloo and not on ftcomm, and why.
KNOWN = {
    "test_monitored_barrier_gloo": "dist.monitored_barrier refuses every backend but gloo by name (torch 2.13), "
                                   "every group without a CPU backend registered in torch's C++ group (2.15); "
                                   "ftcomm.torch.monitored_barrier gives the same barrier",
    "test_monitored_barrier_gloo_subgroup": "as test_monitored_barrier_gloo",
}


def _differences(gloo: dict, ours: dict, messages: dict) -> dict:
    """Tests whose outcome on ftcomm is not gloo's, leaving out the known ones and those ftcomm
    passes where gloo does not (gloo's errors, and its crashes in a job shared with such tests)."""
    return {name: f"gloo {gloo[name]}, ftcomm {ours[name]}: {messages.get(name, '')[:400]}"
            for name in gloo if gloo[name] != ours[name] and name not in KNOWN
            and not (gloo[name] not in ("pass", "skip") and ours[name] == "pass")}


def _compare(n: int, tests: list, tests_per_job: int) -> tuple[dict, dict]:
    gloo, _ = runner.run("gloo", n, tests, tests_per_job)
    ours, messages = runner.run("ftcomm", n, tests, tests_per_job)
    assert _differences(gloo, ours, messages) == {}
    return gloo, ours


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3])
def test_representative_part_ends_as_on_gloo(n):
    gloo, ours = _compare(n, REPRESENTATIVE, tests_per_job=len(REPRESENTATIVE))
    passed = [name for name in REPRESENTATIVE if ours[name] == "pass"]
    # not a comparison of two skips: most of them run (torch skips its "_group" tests at 3 ranks)
    assert len(passed) >= 0.6 * len(REPRESENTATIVE), runner.counts(ours)


@pytest.mark.timeout(600)
def test_a_fresh_job_per_test_ends_as_on_gloo():
    _, ours = _compare(3, FRESH_JOB, tests_per_job=1)
    assert all(ours[name] == "pass" for name in FRESH_JOB), ours


@pytest.mark.torch_suite
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("tests_per_job", [1000, 1], ids=["shared-job", "fresh-job"])
@pytest.mark.parametrize("n", [2, 3])
def test_whole_suite_ends_as_on_gloo(n, tests_per_job):
    tests = runner.suite_tests()
    if tests_per_job == 1:  # a job per test: only those the shared jobs did not skip on gloo (the rest skip at import)
        shared, _ = runner.run("gloo", n, tests, 1000)
        tests = [name for name in tests if shared[name] != "skip"]
    gloo, ours = _compare(n, tests, tests_per_job)
    assert runner.counts(ours)["pass"] >= runner.counts(gloo)["pass"] - len(KNOWN)
