"""The ftcomm torch.distributed backend in real multi-rank jobs (tests/harness.py): every collective
against gloo in the same job, DDP gradients equal gloo's, a rank killed inside a DDP gradient
bucket's allreduce (step redone, samples re-split, training converges), a raw collective failing
cleanly outside a resilient loop, and examples/ddp_train.py --kill reaching its accuracy target."""
import collections
import json
import re

import pytest

from harness import BUCKET_POINT, JOBS, REPO, run_job

pytest.importorskip("torch")


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_collectives_and_ddp_gradients_match_gloo():
    n = 3
    job = run_job(JOBS / "torch_collectives.py", n, timeout=110)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="result")
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["pg_type"] == "ProcessGroupFtcomm" and rep["backend"] == "ftcomm"
        assert rep["checks"] >= 30
        assert rep["errors"] == {}, rep["errors"]
        assert rep["barrier_ok"] is True
        assert rep["unsupported"] == {"BAND": "ok"}
        assert rep["p2p_errors"] == {k: "ok" for k in (("too_long", "tag", "peer") if rep["rank"] == 0
                                                       else ("tag", "peer"))}, rep
        assert rep["bad_input"] == {k: "ok" for k in ("broadcast_empty", "all_gather_empty",
                                                      "all_gather_into_tensor_output",
                                                      "reduce_scatter_tensor_output", "reduce_scatter_input",
                                                      "gather_output", "scatter_input", "all_to_all_single_splits",
                                                      "sparse_dtype", "sparse_shape")}
        assert rep["grad_err"] <= 1e-6, rep
        assert rep["param_err"] <= 1e-6, rep


# (data plane, where in it the victim is hit, how, the victim): ftcomm's ring, and an inner gloo
# group under ftcomm's control plane (FTCOMM_DATA_PLANE=gloo), where a stopped rank is fenced and
# its connections closing end the collective on the others; a stopped world rank 0 also stops the
# inner group's store, which the others must not wait on; a hung rank is fenced at the deadline of
# the collective it kept waiting. By default a representative part; the whole plane x fault matrix
# (kill, exit, hang, stop on both planes) with ``pytest -m matrix``.
PLANES = [("ring", "reduce_scatter", "kill", 2), ("gloo", "data_plane", "kill", 2), ("gloo", "data_plane", "stop", 2),
          ("gloo", "data_plane", "stop", 0), ("gloo", "data_plane", "hang", 2)]
MATRIX = [(plane, point, kind, 2) for plane, point in BUCKET_POINT.items()
          for kind in ("kill", "exit", "hang", "stop") if (plane, point, kind, 2) not in PLANES]


def _cell_id(cell) -> str:
    plane, _, kind, victim = cell
    return f"{plane}-{kind}" + ("" if victim == 2 else f"-rank{victim}")


@pytest.mark.fault
@pytest.mark.timeout(150)
@pytest.mark.parametrize("plane,point,kind,victim",
                         [pytest.param(*c, id=_cell_id(c)) for c in PLANES]
                         + [pytest.param(*c, id=_cell_id(c), marks=pytest.mark.matrix) for c in MATRIX])
def test_kill_in_ddp_backward_allreduce_is_redone_and_converges(plane, point, kind, victim):
    n, samples, batch, epochs = 4, 384, 8, 3
    # allreduce step id 6 (the communicator's ledger counts from 0) = the gradient bucket of
    # training step 7 (one bucket per step, steps counted from 1); 6 steps were applied, so
    # 384 - 6 x 32 = 192 samples remain, a multiple of 3, and the re-split needs no padding.
    job = run_job(JOBS / "torch_ddp_kill.py", n, "--epochs", epochs, "--samples", samples, "--batch", batch,
                  env={"FTCOMM_FAULT": f"rank={victim},point={point},step=6,kind={kind}",
                       "FTCOMM_DATA_PLANE": plane, "FTCOMM_FENCE_TIMEOUT": "5",
                       # a hung rank still answers the liveness probes: the collective's deadline finds it
                       **({"FTCOMM_TIMEOUT": "15"} if kind == "hang" else {})}, timeout=110)
    assert job.returncode == 0, job.describe()
    if kind == "hang":  # judged at the bucket's own deadline, not at that of the step's agreement after it
        assert job.fenced_at(victim) == ["allreduce step 6"], job.describe()
    finals = job.by_rank(kind="final")
    survivors = [r for r in range(n) if r != victim]
    assert sorted(finals) == survivors, job.describe()
    for world_rank, rep in finals.items():
        assert rep["size"] == n - 1
        assert rep["rank"] == survivors.index(world_rank)
        assert rep["sampler"] == [rep["rank"], n - 1]
        assert rep["recoveries"] == [[[victim], n, n - 1, "allreduce", 7]]  # the training step it interrupted
        assert rep["redone"] == 1
        # 6 steps at 4 ranks + 192 / (3 x 8) = 8 at 3 ranks in epoch 0, then 16 per epoch
        assert rep["applied"] == 6 + 8 + 16 * (epochs - 1), rep
        assert rep["avg_err"] < 1e-5, "DDP must average over the new world size"
        assert rep["accuracy"] >= 0.9, rep
    assert len({rep["params"] for rep in finals.values()}) == 1, "survivors' parameters differ"
    # every sample of every epoch used by exactly one applied step (the victim's own applied
    # batches before it died included)
    for epoch in range(epochs):
        used = collections.Counter(
            i for r in job.reports
            if r["kind"] == "batch" and r["epoch"] == epoch and not r["skipped"] for i in r["idx"])
        assert sorted(used) == list(range(samples)), f"epoch {epoch}: samples lost"
        assert max(used.values()) == 1, f"epoch {epoch}: samples used twice"
    skipped = [r for r in job.reports if r["kind"] == "batch" and r["skipped"]]
    assert len(skipped) == n - 1 and all(r["epoch"] == 0 for r in skipped)


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_resplit_after_a_shrink_uses_each_remaining_sample_once():
    """392 samples: after the kill 392 - 6 x 32 = 200 remain, not a multiple of 3. They are dealt
    67 / 67 / 66 without padding: every sample of the epoch is used by exactly one applied step,
    and every survivor applies the same number of steps. Later epochs keep the sampler's own
    padding (392 over 3 ranks: one sample twice)."""
    n, victim, samples, batch, epochs = 4, 2, 392, 8, 2
    job = run_job(JOBS / "torch_ddp_kill.py", n, "--epochs", epochs, "--samples", samples, "--batch", batch,
                  env={"FTCOMM_FAULT": f"rank={victim},point=reduce_scatter,step=6,kind=kill"}, timeout=110)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    # epoch 0: 6 steps at 4 ranks, then ceil(66 / 8) = 9 at 3 ranks; epoch 1: ceil(131 / 8) = 17
    assert {rep["applied"] for rep in finals.values()} == {6 + 9 + 17}
    for epoch, padding in ((0, 0), (1, 3 * 131 - samples)):
        used = collections.Counter(
            i for r in job.reports
            if r["kind"] == "batch" and r["epoch"] == epoch and not r["skipped"] for i in r["idx"])
        assert sorted(used) == list(range(samples)), f"epoch {epoch}: samples lost"
        assert sum(used.values()) - samples == padding, f"epoch {epoch}: {sum(used.values()) - samples} reused"


@pytest.mark.fault
@pytest.mark.timeout(120)
def test_raw_allreduce_outside_resilient_raises_and_group_is_rebuilt():
    n, victim = 4, 0  # world rank 0 also hosts torch's TCP store
    job = run_job(JOBS / "torch_raw_kill.py", n,
                  env={"FTCOMM_FAULT": f"rank={victim},point=allgather,step=3,kind=kill"}, timeout=90)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [1, 2, 3], job.describe()
    full, rest = sum(range(1, n + 1)), sum(range(2, n + 1))
    for world_rank, rep in finals.items():
        assert rep["failures"] == [{"step": 3, "type": "ProcFailedError", "exc_step": 3, "size_after": 3}]
        assert rep["results"] == [full] * 3 + [rest] * 3
        assert rep["rank"] == world_rank - 1 and rep["size"] == 3
        assert rep["bcast"] == 1.0  # new rank 0 is world rank 1
        assert rep["generation"] == 1 and rep["ranks"] == [0, 1, 2]


# (op, how, victim world rank): every op with a rank killed in it, the rooted ones with their
# root (world rank 0) killed too, and a stopped rank (fenced) in two of them; the other stop
# cells behind the matrix marker.
OPS = ("reduce", "gather", "scatter", "all_to_all_single", "all_to_all", "all_gather_coalesced",
       "all_gather_into_tensor_coalesced", "sparse_all_reduce")
OP_CELLS = ([(op, "kill", 2) for op in OPS] + [(op, "kill", 0) for op in ("reduce", "gather", "scatter")]
            + [(op, "stop", 2) for op in ("gather", "all_to_all_single", "sparse_all_reduce")])
OP_MATRIX = [(op, "stop", 2) for op in OPS if (op, "stop", 2) not in OP_CELLS]


@pytest.mark.fault
@pytest.mark.timeout(150)
@pytest.mark.parametrize("op,how,victim", [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]}") for c in OP_CELLS]
                         + [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]}", marks=pytest.mark.matrix)
                            for c in OP_MATRIX])
def test_a_rank_lost_in_a_rooted_or_all_to_all_collective(op, how, victim):
    # outside a resilient loop: ProcFailedError on every survivor, the group rebuilt, and the
    # retry (and every call before and after) gives the members' reference result
    n = 4
    job = run_job(JOBS / "torch_ops_fault.py", n, "--op", op, "--how", how, "--victim", victim,
                  env={"FTCOMM_FENCE_TIMEOUT": "5"}, timeout=110)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    survivors = [w for w in range(n) if w != victim]
    assert sorted(finals) == survivors, job.describe()
    for world_rank, rep in finals.items():
        assert rep["failures"] == [{"at": 3, "type": "ProcFailedError", "size_after": n - 1}], rep
        assert rep["correct"] == [True] * 6, rep
        assert rep["size"] == n - 1 and rep["rank"] == survivors.index(world_rank) and rep["ranks"] == [0, 1, 2]


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_kill_in_reduce_scatter_tensor_leaves_tensors_and_retry_is_exact():
    n, victim = 4, 2
    job = run_job(JOBS / "torch_reduce_scatter_kill.py", n,
                  env={"FTCOMM_FAULT": f"rank={victim},point=reduce_scatter,step=3,ring_step=1,kind=kill"}, timeout=90)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    for rep in finals.values():
        assert rep["failures"] == [{"step": 3, "exc_step": 3, "untouched": True, "size_after": 3}]
        assert rep["results"] == [True] * 6
        assert rep["size"] == 3


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_example_ddp_train_with_kill_reaches_target(tmp_path):
    out = tmp_path / "result.json"
    job = run_job(REPO / "examples" / "ddp_train.py", 4, "--kill", "1@30", "--result-json", out, timeout=120)
    assert job.returncode == 0, job.describe()
    result = json.loads(out.read_text())
    assert result["world_size"] == 3
    assert [e["lost_world_ranks"] for e in result["recoveries"]] == [[1]]
    assert result["accuracy"] >= 0.95, result
    assert "test accuracy:" in job.stdout


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_ddp_outside_resilient_raises_and_trains_on():
    job = run_job(JOBS / "torch_ddp_outside.py", 4,
                  env={"FTCOMM_FAULT": "rank=2,point=reduce_scatter,step=2,kind=kill"}, timeout=120)
    assert job.returncode == 0, job.describe()  # no rank crashed: the error reached DDP as one
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    for rep in finals.values():
        assert rep["errors"] == [{"step": 2, "names_it": True, "size_after": 3}], rep
        # the mean of world ranks 0..3, then of 0, 1, 3; the iteration right after the failure
        # still divides by 4 (DDP's reducer keeps the divide factor of a backward that raised)
        assert rep["grads"][:2] == [2.5, 2.5] and abs(rep["grads"][-1] - (1 + 2 + 4) / 3) < 1e-6, rep


def test_subgroups_made_in_any_order_do_not_hang():
    """Ranks outside a subgroup never reach the backend's factory for it: its creation's tag must
    not depend on how many groups a rank has made."""
    res = run_job(JOBS / "torch_subgroups.py", 3, env={"FTCOMM_TIMEOUT": "20"}, timeout=60)
    assert res.returncode == 0, res.describe()
    got = sorted((tuple(r["members"]), r["world_rank"], r["sum"]) for r in res.reports if "members" in r)
    orders = [[1, 2], [0, 1, 2], [0, 2], [1, 2], [0, 1]]
    want = sorted((tuple(m), r, float(sum(x + 1 for x in m))) for m in orders for r in m)
    assert sorted(set(got)) == sorted(set(want)) and len(got) == len(want), res.describe()
    # named, destroyed (torch forgets them), and made again over the same members
    destroyed = res.by_rank(kind="destroyed")
    assert sorted(destroyed) == [0, 1, 2], res.describe()
    for world_rank, rep in destroyed.items():
        member_of = [i for i, m in enumerate(orders) if world_rank in m]
        assert rep["world_name"] == "0" and len(set(rep["names"])) == len(member_of) and "0" not in rep["names"], rep
        assert len(rep["still_known"]) == (1 if world_rank in orders[0] else 0), rep  # the group made again
        assert rep["again_sum"] == (5.0 if world_rank in orders[0] else world_rank + 1.0), rep
        assert rep["world_sum"] == 6.0, rep


def test_ranks_that_differ_on_the_data_plane_are_told_so_on_every_rank():
    """World rank 1 alone sets FTCOMM_DATA_PLANE=gloo: its first bucket makes an inner group (a
    broadcast) while the others run the ring's allreduce. Every rank raises, naming the setting and
    its own plane, and no step is applied anywhere."""
    job = run_job(JOBS / "torch_mixed_plane.py", 3, env={"FTCOMM_TIMEOUT": "20"}, timeout=60)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 2], job.describe()
    for world_rank, rep in finals.items():
        plane = "gloo" if world_rank == 1 else "ring"
        assert "CollectiveMismatchError" in rep["error"], rep
        assert f"World rank {world_rank} moves a resilient step's buckets on the '{plane}' data plane " \
               "(FTCOMM_DATA_PLANE)" in rep["error"], rep
        assert rep["unchanged"], rep


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_a_stopped_store_server_is_judged_at_a_deadline_not_left_to_the_fence_timeout():
    """World rank 0 (it serves the gloo plane's store) is stopped in a bucket, and the fence timeout
    is longer than the deadline: the others give up on the group when the store stops answering
    (5 s), go on to the step's agreement at once (dropping the group, whose gloo collective still
    waits on the stopped rank, must not hold them up), and its deadline fences the stopped rank."""
    n, victim = 4, 0
    job = run_job(JOBS / "torch_ddp_kill.py", n, "--epochs", 1,
                  env={"FTCOMM_FAULT": f"rank={victim},point=data_plane,step=6,kind=stop", "FTCOMM_DATA_PLANE": "gloo",
                       "FTCOMM_FENCE_TIMEOUT": "30", "FTCOMM_TIMEOUT": "15"}, timeout=110)
    assert job.returncode == 0, job.describe()
    assert re.search(rf"fencing world rank {victim} \(pid \d+\): no heartbeat for [\d.]+ s while peers waited for it",
                     job.stderr), job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [1, 2, 3], job.describe()
    assert all(rep["recoveries"] == [[[victim], n, n - 1, "allreduce", 7]] for rep in finals.values()), finals
    assert len({rep["params"] for rep in finals.values()}) == 1, "survivors' parameters differ"
