"""What moves the bytes of a resilient step's gradient buckets: the data plane.

The control plane is always ftcomm's communicator: it finds failures (ULFM, fencing, deadlines),
agrees on the step's outcome (``step_commit.py``) and rebuilds the membership. The data plane only
moves the uncommitted buckets between one agreement and the next, so any transport will do that
fails (or is made to fail) when a peer dies:

- ``RingPlane`` (``ring_plane.py``): ftcomm's own ring over the communicator (``Communicator.allreduce(commit=False)``),
  the default;
- ``GlooPlane`` (``gloo_plane.py``): an inner torch gloo group over the same ranks, made anew
  after each recovery; host tensors, and CUDA tensors as they are;
- ``NcclPlane`` (``nccl_plane.py``): an inner torch NCCL group for CUDA tensors, host tensors on
  the ring.

The inner groups share their rendezvous, their watching of a collective and their abort
(``inner_group.py``). A plane is one object per process group with six calls:

- ``takes(tensors)``: whether it moves these tensors as they are (else the process group stages
  device tensors through host memory and commits each collective on its own);
- ``fault_point(tensors)``: the ``ftcomm.fault`` point inside their allreduce (fault injection);
- ``allreduce(comm, tensors, op, timeout)``: reduce the tensors it takes in place over ``comm``'s
  ranks, uncommitted, and return the step id the failure or success is reported at;
- ``start_allreduce(comm, tensors, op, timeout)``: the same allreduce started from the caller's
  thread, its watch left to the communication thread (``inner_group.Started``), or None where the
  plane cannot (the ring: always; an inner group: before it is made, and for CUDA tensors);
- ``allgather(comm, src, dst, timeout)``: gather every rank's 1-D ``src`` into ``dst`` in rank
  order, uncommitted (ZeRO's parameter allgather: ``ShardedOptimizer(data_plane=...)``): numpy
  arrays, or tensors the plane ``takes`` (an inner group's: a GPU model's shard, device to device);
- ``abort()``: after a local error, end this rank's part so that peers waiting on it fail now.

A failure raises an ``FtError`` on this rank (the step's agreement makes the outcome uniform);
nothing else is promised about the buffers then.
"""
from __future__ import annotations

from ... import settings
from ...core.cuda import torch_nccl_problem
from .ring_plane import RingPlane


def for_setting():
    """The data plane that ``FTCOMM_DATA_PLANE`` names: "ring", "gloo" or "nccl" (the ring where
    NCCL cannot run: ``ftcomm.cuda_status()`` says why)."""
    name = settings.data_plane()
    if name == "gloo":
        from .gloo_plane import GlooPlane

        return GlooPlane()
    if name == "nccl":
        from .nccl_plane import NcclPlane

        if torch_nccl_problem() is None:
            return NcclPlane()
    return RingPlane()
