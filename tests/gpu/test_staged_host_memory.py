"""The staging and commit logic of the device-buffer allreduce, run on CPU-only machines: device
buffers are host memory behind __cuda_array_interface__ (tests/gpu/fake_cuda.py) and copies are
memcpy, through the same C++ code (csrc/cuda/staged_allreduce.cpp) that uses cudaMemcpyAsync on a
GPU. Results are compared bitwise with the host path's on the same data."""
import numpy as np
import pytest

from gpu_env import JOB_ENV, JOBS, KILL_IN_ALLGATHER, assert_recovered_from_kill_in_allgather, fcuda
from fake_cuda import FakeCudaArray
from harness import run_job

from ftcomm.core import buffers
from ftcomm.core.codes import InputProblem


@pytest.mark.parametrize("n", [2, 4])
def test_fake_device_allreduce_matches_host_path(n):
    job = run_job(JOBS / "device_allreduce.py", n, "fake", "check", env=JOB_ENV, timeout=240)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="check")
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["mismatches"] == [], rep
        assert rep["steps"] == 250
        assert rep["bucket_ok"] and rep["replay_ok"], rep
        assert "rank 0 (world rank 0) rejected its input: host and device buffers are mixed" in rep["mixed"], rep
        assert "saw: buffer 1 (ndarray) is host memory" in rep["mixed"], rep
        assert rep["mixed_untouched"], rep
        assert f"rank {n - 1} (world rank {n - 1}) rejected its input" in rep["bad"] and rep["bad_untouched"], rep


@pytest.mark.fault
def test_fake_device_allreduce_kill_in_allgather():
    job = run_job(JOBS / "device_allreduce.py", 4, "fake", "fault", env={**JOB_ENV, **KILL_IN_ALLGATHER}, timeout=120)
    assert_recovered_from_kill_in_allgather(job)


@pytest.mark.fault
def test_fake_device_allreduce_guard_catches_a_flip_in_transit():
    """checksums=True on device buffers: the guard runs on their pinned host copy."""
    flip = {"FTCOMM_FAULT": "rank=2,point=reduce_scatter,step=1,ring_step=0,chunk=0,kind=bitflip"}
    job = run_job(JOBS / "device_guard.py", 4, env={**JOB_ENV, **flip}, timeout=120)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="guard")
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["error"] == {"type": "SilentCorruptionError", "ranks": [1, 2], "unchanged": True}, rep
        assert rep["correct"] is True


def test_describe_routes_device_buffers():
    fcuda._use_host_memory_for_tests(True)
    try:
        a = FakeCudaArray(np.arange(10, dtype=np.float32), stream=2)
        b = FakeCudaArray(np.arange(3, dtype=np.int64))
        d = buffers.describe([a, b])
        assert d.problem == InputProblem.NONE and d.device == -1
        assert d.triples == [(a.host.ctypes.data, 10, 0, 2), (b.host.ctypes.data, 3, 5, 0)]
        mixed = buffers.describe([a, np.ones(3, np.float32)])
        assert mixed.problem == InputProblem.MIXED_DEVICES and mixed.triples == []
        assert "buffer 1" in mixed.detail and "host memory" in mixed.detail
        ro = buffers.describe(FakeCudaArray(np.ones(4, np.float32), readonly=True))
        assert ro.problem == InputProblem.READ_ONLY
        u8 = buffers.describe(FakeCudaArray(np.ones(4, np.uint8)))
        assert u8.problem == InputProblem.UNSUPPORTED_DTYPE
        host = buffers.describe(np.ones(3, np.float32))
        assert host.device is None and host.problem == InputProblem.NONE
    finally:
        fcuda._use_host_memory_for_tests(False)


@pytest.mark.skipif(fcuda.cuda_available(), reason="checks the behaviour without a usable GPU")
def test_without_cuda_device_buffers_are_a_clear_error():
    assert fcuda.cuda_available() is False
    assert fcuda.cuda_status()  # says why
    d = buffers.describe(FakeCudaArray(np.ones(4, np.float32)))
    assert d.problem == InputProblem.MIXED_DEVICES
    assert "CUDA is unavailable" in d.detail
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        fcuda.DeviceArray(4)
