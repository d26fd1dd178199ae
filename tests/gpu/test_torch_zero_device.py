"""``ZeroRedundancyOptimizer`` with the model on a (stand-in) device: the shard's state on the
device (ftcomm/torch/zero/device_shard.py) or offloaded to the host (ftcomm/torch/zero/host_master.py); the
device parameters receive each committed step. Runs on CPU with tests/gpu/fake_torch_device.py."""
import pytest

pytest.importorskip("torch")

from gpu_env import JOB_ENV, JOBS  # noqa: E402
from harness import run_job  # noqa: E402

KILL_IN_SHARD_UPDATE = {**JOB_ENV, "FTCOMM_FAULT": "rank=3,point=shard_update,step=5,kind=kill"}


def reports_of(kind: str, ranks: list, *args, env=JOB_ENV, **run):
    """Runs tests/gpu/jobs/torch_zero_device.py with ``args`` at 4 ranks; returns (job, its
    ``kind`` reports by world rank), checked to exit 0 with reports from exactly ``ranks``."""
    job = run_job(JOBS / "torch_zero_device.py", 4, *args, env=env, timeout=300, **run)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind=kind)
    assert sorted(reports) == ranks, job.describe()
    return job, reports


@pytest.mark.parametrize("plane", ["ring", "gloo"])
def test_device_parameters_train_exactly_as_host_ones(plane):
    env = {**JOB_ENV, "FTCOMM_DATA_PLANE": plane}
    job, reports = reports_of("compare", [0, 1, 2, 3], "compare", env=env)
    for rep in reports.values():
        assert rep["plane"] == plane, rep
        for name in ("device", "offload"):
            assert rep[name]["param_diff"] == 0.0 and rep[name]["state_diff"] == 0.0, rep
            assert rep[name]["moved"], rep  # the device parameters did change
            assert rep[name]["scrub_found"] is False, rep
        device, offload = rep["device"], rep["offload"]
        assert device["on_device"] and device["device_matches_host"] is True, rep
        assert not offload["on_device"], rep
        # 12 steps. State on the device: no gradient leaves it, one shard copy to the host per
        # step (which the allgather and the replicas waited for: else the result would differ),
        # the live shard copied to the device once, at construction.
        assert device["copies"]["to_host"] == 4 and device["copies"]["shard_to_host"] == 12, rep
        assert device["copies"]["to_device"] == 1, rep
        # Offloaded: the gradients of 4 parameters went to the host each step (plus the 4 master
        # copies at construction), no shard copies; the parameters back after each step, plus at
        # construction.
        assert offload["copies"]["to_host"] == 4 + 12 * 4 and offload["copies"]["shard_to_host"] == 0, rep
        assert offload["copies"]["copy_back"] == 13 and offload["copies"]["copy_on_device"] == 0, rep
        if plane == "ring":  # the allgather on the host copies: the parameters back after each step
            assert device["copies"]["copy_back"] == 13 and device["copies"]["to_host_async"] == 0, rep
            assert device["copies"]["copy_on_device"] == 0, rep
        else:  # allgathered on the device: copied into the parameters there, and to the host flat copy
            assert device["copies"]["copy_back"] == 1, rep  # construction only
            assert device["copies"]["copy_on_device"] == 12 and device["copies"]["to_host_async"] == 12, rep


def test_other_optimizers_state_dicts_scrub_and_added_groups_on_the_device():
    job, reports = reports_of("api", [0, 1, 2, 3], "api")
    for rep in reports.values():
        for name in ("SGD", "Adagrad", "RMSprop", "ASGD", "AdamW"):
            assert rep[name]["param_diff"] == 0.0 and rep[name]["state_diff"] == 0.0, (name, rep)
            assert rep[name]["device_matches_host"] is True, (name, rep)
        assert rep["AdamW"]["on_device"] and rep["AdamW"]["extra_diff"] == 0.0, rep
        assert rep["AdamW"]["scrub_found"] == [False, False], rep


@pytest.mark.fault
@pytest.mark.parametrize("mode", ["device", "offload"])
def test_kill_in_the_shard_update_leaves_device_parameters_at_the_committed_step(mode):
    job, reports = reports_of("kill", [0, 1, 2], "kill", mode, env=KILL_IN_SHARD_UPDATE)
    for rep in reports.values():
        assert rep["voided"] == [True] and rep["size"] == 3, rep
        assert rep["device"] == rep["engine"], rep  # the device holds the engine's committed parameters
        assert rep["device_matches_host"] is (True if mode == "device" else None), rep
    assert len({(r["device"], r["state"], r["steps"]) for r in reports.values()}) == 1, reports


@pytest.mark.fault
@pytest.mark.parametrize("point, plane", [
    ("param_allgather", "ring"), ("replicate", "ring"), ("replicate", "gloo"),
    pytest.param("param_allgather", "gloo", marks=pytest.mark.matrix)])  # the gloo plane's subset by default
def test_kill_after_the_shard_copy_started_recovers_the_device_shard(point, plane):
    """A rank dies while the new shard is being copied to the host or right after (the copy's
    buffers are reused by the rebuild), and on the gloo plane before or after the allgather
    into the device buffer: every survivor's device shard is its host shard, bitwise, and its
    device parameters are the committed ones."""
    env = {**JOB_ENV, "FTCOMM_DATA_PLANE": plane, "FTCOMM_FAULT": f"rank=1,point={point},step=4,kind=kill"}
    job, reports = reports_of("kill", [0, 2, 3], "kill", "device", env=env)
    for rep in reports.values():
        assert rep["voided"] == [True] and rep["device_matches_host"] is True, rep
        assert rep["device"] == rep["engine"], rep
    assert len({(r["device"], r["state"], r["steps"]) for r in reports.values()}) == 1, reports


# (mode, where rank 3 dies, plane): in the shard update, or in the replication, after the
# allgather wrote the step's parameters into the host flat copy (the device parameters must then
# stay at the committed step until the hand-over, though the rebuild waits for the spare).
SPARE_CELLS = [("device", "shard_update", "ring"), ("offload", "shard_update", "ring"), ("device", "replicate", "ring"),
               pytest.param("device", "replicate", "gloo", marks=pytest.mark.matrix),
               pytest.param("device", "shard_update", "gloo", marks=pytest.mark.matrix)]


@pytest.mark.fault
@pytest.mark.parametrize("mode, point, plane", SPARE_CELLS)
def test_spare_receives_its_shard_and_its_device_parameters(mode, point, plane):
    env = {**JOB_ENV, "FTCOMM_DATA_PLANE": plane, "FTCOMM_FAULT": f"rank=3,point={point},step=5,kind=kill"}
    job, reports = reports_of("kill", [0, 1, 2, 4], "kill", mode, env=env, launcher_args=("--spares", "1"))
    for rep in reports.values():
        assert rep["size"] == 4 and rep["device"] == rep["engine"], rep
        assert rep["device_matches_host"] is (True if mode == "device" else None), rep
    assert all(reports[r]["voided"] == [True] for r in (0, 1, 2)), reports
    assert len({(r["device"], r["state"], r["steps"]) for r in reports.values()}) == 1, reports


@pytest.mark.fault
def test_a_device_error_on_one_rank_voids_the_step_everywhere_at_once():
    """A rank's update raises (out of device memory, say): its peers do not wait for a deadline;
    the step is voided on every rank, that rank raises its own error, and once it is gone the
    others go on with identical state."""
    env = {**JOB_ENV, "FTCOMM_TIMEOUT": "120"}
    job, reports = reports_of("kill", [0, 2, 3], "device_error", env=env)
    raised = job.by_rank(kind="raised")
    assert sorted(raised) == [1] and raised[1]["error"] == "RuntimeError: CUDA out of memory (stand-in)", job.describe()
    assert raised[1]["step"] == 2, raised  # steps 1 and 2 committed, step 3 voided
    for rep in reports.values():
        assert rep["voided"] == [True] and rep["size"] == 3 and rep["device_matches_host"] is True, rep
    assert len({(r["device"], r["state"], r["steps"]) for r in reports.values()}) == 1, reports
    assert job.wall_s < 100, job.wall_s  # far below the 120 s deadline a hang would have waited for
