"""What moves the bytes of a resilient step's gradient buckets: the data plane.

The control plane is always ftcomm's communicator: it finds failures (ULFM, fencing, deadlines),
agrees on the step's outcome (``step_commit.py``) and rebuilds the membership. The data plane only
moves the uncommitted buckets between one agreement and the next, so any transport will do that
fails (or is made to fail) when a peer dies:

- ``RingPlane``: ftcomm's own ring over the communicator (``Communicator.allreduce(commit=False)``),
  the default;
- ``GlooPlane`` (``gloo_plane.py``): an inner torch gloo group over the same ranks, made anew
  after each recovery.

A plane is one object per process group with three calls:

- ``allreduce(comm, tensors, op, timeout)``: reduce the host tensors in place over ``comm``'s
  ranks, uncommitted, and return the step id the failure or success is reported at;
- ``allgather(comm, src, dst, timeout)``: gather every rank's 1-D numpy ``src`` into ``dst`` in
  rank order, uncommitted (ZeRO's parameter allgather: ``ShardedOptimizer(data_plane=...)``);
- ``abort()``: after a local error, end this rank's part so that peers waiting on it fail now.

A failure raises an ``FtError`` on this rank (the step's agreement makes the outcome uniform);
nothing else is promised about the buffers then.
"""
from __future__ import annotations

from ... import settings


class RingPlane:
    """ftcomm's ring: the communicator's uncommitted allreduce (no undo log, no agreement)."""

    name = "ring"

    def allreduce(self, comm, tensors, op: str, timeout) -> int:
        return comm.allreduce(tensors, op=op, timeout=timeout, commit=False)

    def allgather(self, comm, src, dst, timeout) -> None:
        comm.allgather(src, dst, timeout=timeout)

    def abort(self) -> None:
        """Nothing: the caller revokes the communicator, which ends the ring's waits."""


def for_setting():
    """The data plane that ``FTCOMM_DATA_PLANE`` names: "ring" or "gloo"."""
    if settings.data_plane() == "gloo":
        from .gloo_plane import GlooPlane

        return GlooPlane()
    return RingPlane()
