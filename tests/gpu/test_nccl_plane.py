"""The NCCL data plane (ftcomm/torch/group/nccl_plane.py) at world size 1: NCCL refuses two ranks on
one GPU, so a one-GPU machine checks here what it can: the inner group is made, its allreduces
are exact on CUDA tensors, an abort from another thread ends a collective still queued behind a
kernel, and the next collective makes a new group. DDP at world size 1 on the NCCL plane ends
bitwise where the staged ring ends, and so does DDP with ZeroRedundancyOptimizer, whose
parameter allgather then runs on NCCL from the device shard. Skipped without torch's NCCL and a CUDA device
(scripts/gpu_check.sh runs it)."""
import threading

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import ftcomm  # noqa: E402
from gpu_env import JOB_ENV, JOBS  # noqa: E402
from harness import run_job  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (dist.is_nccl_available() and torch.cuda.is_available()), reason="needs torch with NCCL and a CUDA device")]
DEADLINE = 60.0


@pytest.fixture(scope="module")
def plane_and_comm():
    from ftcomm.torch.group.nccl_plane import NcclPlane

    torch.cuda.set_device(0)
    return NcclPlane(), ftcomm.Communicator(timeout=DEADLINE)


@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_allreduce_on_cuda_tensors_is_exact(plane_and_comm, op):
    plane, comm = plane_and_comm
    gen = torch.Generator().manual_seed(7)
    bucket = [torch.randn(n, generator=gen).to(dtype).cuda() for n, dtype in
              ((1000, torch.float32), (17, torch.float64), (1 << 20, torch.float32))]
    before = [t.clone() for t in bucket]
    for tensors in (bucket[:1], bucket):  # one tensor, and a coalesced bucket
        plane.allreduce(comm, tensors, op, DEADLINE)
    torch.cuda.synchronize()
    for t, ref in zip(bucket, before):  # world size 1: every op leaves the values as they were
        assert torch.equal(t, ref), op
    assert plane.completed["allreduce"] >= 2


def test_an_abort_from_another_thread_ends_a_queued_collective_and_the_next_one_regroups(plane_and_comm):
    plane, comm = plane_and_comm
    t = torch.ones(1 << 16, device="cuda")
    plane.allreduce(comm, [t], "sum", DEADLINE)  # the group exists
    made = plane.groups_made
    torch.cuda._sleep(int(3e9))  # about a second or more of GPU time queued before the collective
    threading.Timer(0.2, plane.abort).start()
    with pytest.raises(ftcomm.ProcFailedError, match="this rank aborted the group"):
        plane.allreduce(comm, [t], "sum", DEADLINE)
    torch.cuda.synchronize()
    again = torch.full((1000,), 3.0, device="cuda")
    plane.allreduce(comm, [again], "sum", DEADLINE)
    assert torch.equal(again.cpu(), torch.full((1000,), 3.0))
    assert plane.groups_made == made + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8])
def test_the_result_fingerprint_word_sum_on_the_device_equals_the_host_one(dtype):
    from ftcomm.torch.group.step_fingerprints import word_sum

    host = (torch.randn(1 << 20, generator=torch.Generator().manual_seed(3)) * 100).to(dtype)
    on_device = word_sum(host.cuda())
    assert on_device.device.type == "cuda" and int(on_device) == int(word_sum(host))


def test_ddp_on_the_nccl_plane_ends_where_the_staged_ring_ends():
    """With FTCOMM_FINGERPRINTS=1 as well: the bucket results' fingerprints taken on the device, no
    false alarm, the same end."""
    digests = {}
    for plane, extra in (("ring", {}), ("nccl", {}), ("nccl", {"FTCOMM_FINGERPRINTS": "1"})):
        job = run_job(JOBS / "ddp_device.py", 1, "--device", "cuda",
                      env={**JOB_ENV, "FTCOMM_DATA_PLANE": plane, **extra}, timeout=240)
        assert job.returncode == 0, job.describe()
        rep = job.by_rank(kind="final")[0]
        assert rep["plane"] == plane, rep
        if plane == "nccl":
            assert rep["plane_allreduces"] > 0, rep  # the buckets went through NCCL
        assert "silent data corruption" not in job.stderr, job.describe()
        digests[plane, bool(extra)] = (rep["params"], rep["optimizer"])
    assert len(set(digests.values())) == 1, digests


def test_zero_on_the_nccl_plane_allgathers_on_the_device_and_ends_where_the_ring_ends():
    digests = {}
    for plane in ("ring", "nccl"):
        job = run_job(JOBS / "ddp_device.py", 1, "--device", "cuda", "--zero",
                      env={**JOB_ENV, "FTCOMM_DATA_PLANE": plane}, timeout=240)
        assert job.returncode == 0, job.describe()
        rep = job.by_rank(kind="final")[0]
        assert rep["plane"] == plane and rep["shard_on_device"] and rep["device_matches_host"], rep
        if plane == "nccl":
            assert rep["plane_allgathers"] == rep["applied"] > 0, rep  # every step's allgather on NCCL
        digests[plane] = (rep["params"], rep["optimizer"])
    assert digests["ring"] == digests["nccl"], digests
