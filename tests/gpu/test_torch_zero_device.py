"""``ZeroRedundancyOptimizer`` with the model on a (stand-in) device: the engine works on host
master copies, the device parameters receive each committed step (ftcomm/torch/host_master.py).
Runs on CPU with tests/gpu/fake_torch_device.py."""
import pytest

pytest.importorskip("torch")

from gpu_env import JOB_ENV, JOBS  # noqa: E402
from harness import run_job  # noqa: E402


def test_device_parameters_train_exactly_as_host_ones():
    job = run_job(JOBS / "torch_zero_device.py", 4, "compare", env=JOB_ENV, timeout=240)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="compare")
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["param_diff"] == 0.0 and rep["state_diff"] == 0.0, rep
        assert rep["moved"], rep  # the device parameters did change
        # 12 steps: the gradients of 4 parameters went to the host each step, and the parameters
        # came back after each step (plus once at construction)
        assert rep["grads_to_host"] >= 12 * 4 and rep["params_to_device"] == 13, rep


@pytest.mark.fault
def test_kill_in_the_shard_update_leaves_device_parameters_at_the_committed_step():
    env = {**JOB_ENV, "FTCOMM_FAULT": "rank=3,point=shard_update,step=5,kind=kill"}
    job = run_job(JOBS / "torch_zero_device.py", 4, "kill", env=env, timeout=240)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="kill")
    assert sorted(reports) == [0, 1, 2], job.describe()
    for rep in reports.values():
        assert rep["voided"] == [True] and rep["size"] == 3, rep
        assert rep["device"] == rep["engine"], rep  # the device holds the engine's committed parameters
    assert len({(r["device"], r["steps"]) for r in reports.values()}) == 1, reports


@pytest.mark.fault
def test_spare_receives_its_shard_and_its_device_parameters():
    env = {**JOB_ENV, "FTCOMM_FAULT": "rank=3,point=shard_update,step=5,kind=kill"}
    job = run_job(JOBS / "torch_zero_device.py", 4, "kill", env=env, timeout=240, launcher_args=("--spares", "1"))
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="kill")
    assert sorted(reports) == [0, 1, 2, 4], job.describe()
    for rep in reports.values():
        assert rep["size"] == 4 and rep["device"] == rep["engine"], rep
    assert all(reports[r]["voided"] == [True] for r in (0, 1, 2)), reports
    assert len({(r["device"], r["steps"]) for r in reports.values()}) == 1, reports
