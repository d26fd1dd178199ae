"""The default data plane: ftcomm's own ring over the communicator (``data_plane.py``)."""
from __future__ import annotations

from .device import is_device
from .plane_mismatch import naming_the_plane


class RingPlane:
    """ftcomm's ring: the communicator's uncommitted allreduce (no undo log, no agreement)."""

    name = "ring"

    def takes(self, tensors) -> bool:
        """Host tensors only: device tensors are staged through host memory (``device.py``)."""
        return not any(is_device(t) for t in tensors)

    def fault_point(self, tensors) -> str:
        """The ``ftcomm.fault`` point inside an allreduce of ``tensors`` (fault injection)."""
        return "reduce_scatter"

    def allreduce(self, comm, tensors, op: str, timeout) -> int:
        with naming_the_plane(self.name, comm):
            return comm.allreduce(tensors, op=op, timeout=timeout, commit=False)

    def start_allreduce(self, comm, tensors, op: str, timeout) -> None:
        """None: the ring runs on the communication thread (``InnerGroupPlane.start_allreduce``)."""
        return None

    def allgather(self, comm, src, dst, timeout) -> None:
        with naming_the_plane(self.name, comm):
            comm.allgather(src, dst, timeout=timeout)

    def abort(self) -> None:
        """Nothing: the caller revokes the communicator, which ends the ring's waits."""
