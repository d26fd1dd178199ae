"""Shared by tests/gpu: whether this machine can run the CUDA tests, and why not."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
JOBS = HERE / "jobs"
# Job scripts import harness (tests/), fake_cuda (tests/gpu/) and ftcomm (the repo, when it is
# built in place rather than installed). run_job replaces PYTHONPATH with this: keep the caller's.
JOB_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), str(HERE), str(HERE.parent.parent),
                                                       os.environ.get("PYTHONPATH")]))}

import ftcomm.cuda as fcuda  # noqa: E402  (after the paths; loads MPI as a singleton)

CUDA_OK = fcuda.cuda_available()
CUDA_WHY = fcuda.cuda_status()
requires_gpu = pytest.mark.skipif(not CUDA_OK, reason=f"needs a CUDA device: {CUDA_WHY}")


def torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def cupy_cuda() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any CuPy/driver problem means "not usable"
        return False


if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


KILL_IN_ALLGATHER = {"FTCOMM_FAULT": "rank=1,point=allgather,step=2,kind=kill"}


def assert_recovered_from_kill_in_allgather(job) -> None:
    """The checks on tests/gpu/jobs/device_allreduce.py's "fault" mode at 4 ranks, rank 1 killed
    (KILL_IN_ALLGATHER): the same error everywhere, device buffers untouched, the retry right and
    bitwise identical on every survivor. Shared by the real-GPU and the fake-device tests."""
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="fault")
    assert sorted(reports) == [0, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["error"] == {"type": "ProcFailedError", "step": 2, "failed_ranks": [1]}, rep
        assert rep["untouched"], "a device buffer was written by an aborted step"
        assert rep["retry_ok"] and rep["size"] == 3 and rep["last_step"] == 2, rep
    assert len({rep["digest"] for rep in reports.values()}) == 1
