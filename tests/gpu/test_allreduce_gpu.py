"""The device-buffer allreduce on a real GPU: 2 and 4 ranks sharing one device, every dtype x op
x length bitwise against the host path, with ftcomm's DeviceArray, torch CUDA tensors and CuPy
arrays; and a rank SIGKILLed in the allgather of step 2 with CUDA buffers."""
import pytest

from gpu_env import (JOB_ENV, JOBS, KILL_IN_ALLGATHER, assert_recovered_from_kill_in_allgather, cupy_cuda,
                     requires_gpu, torch_cuda)
from harness import run_job

pytestmark = [pytest.mark.gpu, requires_gpu]

MODES = ["devicearray",
         pytest.param("torch", marks=pytest.mark.skipif(not torch_cuda(), reason="torch without CUDA")),
         pytest.param("cupy", marks=pytest.mark.skipif(not cupy_cuda(), reason="CuPy with a device not found"))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [2, 4])
def test_device_allreduce_matches_host_path(n, mode):
    job = run_job(JOBS / "device_allreduce.py", n, mode, "check", env=JOB_ENV, timeout=300)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="check")
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["mismatches"] == [], rep
        assert rep["bucket_ok"] and rep["replay_ok"], rep
        assert "host and device buffers are mixed" in rep["mixed"] and rep["mixed_untouched"], rep
        assert rep["bad"] and rep["bad_untouched"], rep


@pytest.mark.fault
@pytest.mark.parametrize("mode", MODES[:2])
def test_device_allreduce_kill_in_allgather(mode):
    job = run_job(JOBS / "device_allreduce.py", 4, mode, "fault", env={**JOB_ENV, **KILL_IN_ALLGATHER}, timeout=180)
    assert_recovered_from_kill_in_allgather(job)
