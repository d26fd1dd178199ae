"""DDP over the ftcomm backend with the model on a GPU (4 ranks sharing it), a rank killed in a
gradient allreduce: the survivors recover with bitwise equal state; with a spare, the newcomer
receives the state (AdamW's whole, or its ZeroRedundancyOptimizer shard) and the job ends at 4
ranks. Skipped without torch CUDA; scripts/gpu_check.sh
runs them on a GPU, and its --cpu-dry-run runs two of them (a kill under ZeRO, a spare under ZeRO
with offload) on CPU (GPU_CHECK_DEVICE=cpu)."""
import os

import pytest

pytest.importorskip("torch")

from gpu_env import JOB_ENV, JOBS, torch_cuda  # noqa: E402
from harness import run_job  # noqa: E402

DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")
pytestmark = [pytest.mark.fault,
              pytest.mark.skipif(DEVICE == "cuda" and not torch_cuda(), reason="needs torch with a CUDA device")]
KILL = {"FTCOMM_FAULT": "rank=2,point=reduce_scatter,step=10,kind=kill"}


def finals(job, ranks):
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="final")
    assert sorted(reports) == ranks, job.describe()
    assert len({(r["params"], r["optimizer"]) for r in reports.values()}) == 1, reports
    for rep in reports.values():
        assert rep["device"] == DEVICE and rep["redone"] == 1, rep
    return reports


def _zero_args(optimizer: str) -> tuple:
    return {"adamw": (), "zero": ("--zero",), "zero-offload": ("--zero", "--offload")}[optimizer]


def _check_shard(reports, optimizer: str) -> None:
    """ZeRO on a GPU keeps the shard's state there (unless offloaded), equal to its host copy."""
    if optimizer == "adamw":
        return
    on_device = DEVICE == "cuda" and optimizer == "zero"
    for rep in reports.values():
        assert rep["shard_on_device"] is on_device, rep
        assert rep["device_matches_host"] is on_device, rep


@pytest.mark.parametrize("optimizer, plane", [("adamw", "ring"), ("zero", "ring"), ("adamw", "gloo"), ("zero", "gloo")])
def test_kill_recovers_with_identical_state_on_the_survivors(optimizer, plane):
    """On "gloo", the buckets (CUDA tensors on a GPU) go through an inner gloo group as they are,
    under ftcomm's control plane, and so does ZeRO's parameter allgather (from the device shard
    into device memory); the kill is then in that plane's allreduce."""
    kill = KILL if plane == "ring" else {"FTCOMM_FAULT": KILL["FTCOMM_FAULT"].replace("reduce_scatter", "data_plane")}
    job = run_job(JOBS / "ddp_device.py", 4, "--device", DEVICE, *_zero_args(optimizer),
                  env={**JOB_ENV, **kill, "FTCOMM_DATA_PLANE": plane}, timeout=240)
    reports = finals(job, [0, 1, 3])
    for rep in reports.values():
        assert rep["world_size"] == 3 and rep["plane"] == plane, rep
        if plane == "gloo":
            assert rep["plane_allreduces"] > 0, rep
            assert (rep["plane_allgathers"] > 0) is (optimizer == "zero"), rep
    _check_shard(reports, optimizer)


@pytest.mark.parametrize("optimizer", ["adamw", "zero", "zero-offload"])
def test_spare_takes_the_place_of_the_killed_rank(optimizer):
    job = run_job(JOBS / "ddp_device.py", 4, "--device", DEVICE, *_zero_args(optimizer), env={**JOB_ENV, **KILL},
                  timeout=240, launcher_args=("--spares", "1"))
    reports = finals(job, [0, 1, 3, 4])
    assert all(rep["world_size"] == 4 for rep in reports.values()), reports
    assert reports[4]["joined"], reports[4]
    _check_shard(reports, optimizer)
