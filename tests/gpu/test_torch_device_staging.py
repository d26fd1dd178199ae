"""The torch backend's collectives on CUDA tensors, run on CPU-only machines: host tensors stand
in for device tensors (tests/gpu/fake_torch_device.py) through the same staging code
(ftcomm/torch/group/device.py) that a GPU runs with CUDA events and pinned copies."""
import pytest

pytest.importorskip("torch")

from gpu_env import JOB_ENV, JOBS  # noqa: E402
from harness import run_job  # noqa: E402

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "reduce_scatter")


def test_collectives_wait_for_the_stream_and_match_the_host_path():
    job = run_job(JOBS / "torch_device_staging.py", 4, "check", env=JOB_ENV, timeout=240)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="check")
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["errors"] == {}, rep  # a copy-in before the kernel finished reads zeros
        assert rep["order_ok"], rep
        assert rep["waits"] == len(COLLECTIVES) and rep["copy_backs"] == len(COLLECTIVES), rep


@pytest.mark.fault
def test_failed_collective_leaves_device_tensors_untouched():
    env = {**JOB_ENV, "FTCOMM_FAULT": "rank=3,point=allgather,step=1,ring_step=0,kind=kill"}
    job = run_job(JOBS / "torch_device_staging.py", 4, "abort", env=env, timeout=180)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="abort")
    assert sorted(reports) == [0, 1, 2], job.describe()
    for rep in reports.values():
        assert rep["error"] == "ProcFailedError", rep
        assert rep["untouched"] and rep["copy_backs_after"] == 0, rep
        assert rep["size"] == 3, rep
