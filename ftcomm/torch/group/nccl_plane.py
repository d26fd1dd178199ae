"""The NCCL data plane: a resilient step's gradient buckets on CUDA tensors through an inner torch
``ProcessGroupNCCL`` (``inner_group.py``: its rendezvous, watching and abort), with no copy to the
host; ftcomm's communicator stays the control plane (the step's one agreement, recovery).

- **Made eagerly.** The NCCL communicator is connected when the group is made
  (``eager_connect_single_device``), under a watchdog bounded by the deadline: a peer that dies in
  NCCL's bootstrap cannot hang this rank for ever (the watchdog kills it, and its peers see that).
- **Watched, not waited.** ``Work.is_completed()`` is polled from the communication thread, so that
  ftcomm decides when a collective has failed (a dead or stopped peer, another member's abort, the
  deadline) and calls ``ProcessGroupNCCL.abort()`` from outside the collective, which NCCL's
  ``ncclCommAbort`` ends. torch's own NCCL timeout is set past ftcomm's deadline, and its error
  handling to clean up without ending the process (``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` while the
  group is made), so that the survivors live to recover.
- **Made anew.** After a recovery the next bucket makes a new group over the new membership, under
  a new store; the old one is aborted, never destroyed (destroying waits for a dead peer).
- **ZeRO's parameter allgather** of a model on the GPU gathers the new parameter shards from
  device memory into device memory here too (``ShardedOptimizer._allgather_params``).
- **Host tensors** (buckets on the CPU, a CPU model's parameter allgather) go through ftcomm's
  ring.

NCCL cannot put two ranks on one GPU ("Duplicate GPU detected"): with one GPU this plane runs at
world size 1 only (``scripts/gpu_check.sh``). torch 2.15's ``ProcessGroupNCCL.shrink`` could
replace the fresh group after a shrink; it is not used yet (no machine with two GPUs has measured it).
"""
from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from ...core import liveness
from .inner_group import REDUCE_OPS, InnerGroupPlane, on_one_device
from .lifetime import deadline
from .ring_plane import RingPlane

_TORCH_DEADLINE_MARGIN = 60.0  # seconds torch's NCCL watchdog waits past ftcomm's deadline
_ENV_LOCK = threading.Lock()


class NcclPlane(InnerGroupPlane):
    """An inner ``ProcessGroupNCCL`` on the current CUDA device, over the ranks of the
    communicator it is given; host tensors go through ftcomm's ring (``RingPlane``)."""

    name = "nccl"

    def __init__(self):
        super().__init__()
        self._ring = RingPlane()

    # takes: host tensors (through the ring) or device tensors on one device (through NCCL), as
    # every inner group plane.
    def fault_point(self, tensors) -> str:
        return super().fault_point(tensors) if on_one_device(tensors) else self._ring.fault_point(tensors)

    def allreduce(self, comm, tensors, op: str, timeout) -> int:
        if not on_one_device(tensors):
            return self._ring.allreduce(comm, tensors, op, timeout)
        return super().allreduce(comm, tensors, op, timeout)

    def starts_inline(self, tensors) -> bool:
        """False: host tensors take the ring, and a CUDA tensor's Work completing from NCCL's
        thread would need its streams' order kept, which no GPU has checked yet."""
        return False

    def allgather(self, comm, src, dst, timeout) -> None:
        """ZeRO's parameter allgather: device tensors through NCCL, host arrays through ftcomm's
        ring."""
        if isinstance(src, torch.Tensor) and on_one_device([src, dst]):
            super().allgather(comm, src, dst, timeout)
        else:
            self._ring.allgather(comm, src, dst, timeout)

    def _make_group(self, store, rank: int, size: int, timeout: float, device):
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = deadline(timeout + _TORCH_DEADLINE_MARGIN)
        with _ENV_LOCK:  # read once, by the constructor
            before = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"  # CleanUpOnly: abort the comm, keep the process
            try:
                group = dist.ProcessGroupNCCL(store, rank, size, options)
            finally:
                if before is None:
                    del os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
                else:
                    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = before
        with liveness.watchdog(timeout, f"connecting the NCCL data plane over {size} ranks"):
            group.eager_connect_single_device(device)
        return group

    def _start_allreduce(self, group, tensors, op: str, timeout) -> list:
        if len(tensors) == 1:
            opts = dist.AllreduceOptions()
            opts.reduceOp = REDUCE_OPS[op]
            return [group.allreduce(list(tensors), opts)]
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = REDUCE_OPS[op]
        return [group.allreduce_coalesced(list(tensors), opts)]

    def _start_allgather(self, group, out, inp, timeout):
        return group._allgather_base(out, inp, _c10d.AllgatherOptions())

    def _ended_within(self, work, seconds: float) -> bool:
        """NCCL's ``wait(timeout)`` may abort the communicator itself when it times out: poll."""
        if work.is_completed():
            return True
        time.sleep(seconds)
        return work.is_completed()

    def _abort_group(self, group) -> None:
        group.abort()
