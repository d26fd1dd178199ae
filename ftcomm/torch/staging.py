"""Where tensors meet ftcomm's host-memory core.

ftcomm's core reduces host memory (the PyPI Open MPI is built without CUDA). CPU tensors go as
they are. Device tensors would be staged through host memory here: ``stage`` returns host tensors
to communicate and a ``finish`` callable that writes results back; the CUDA path (synchronise the
producer stream, copy to pinned host memory, copy back, build futures with the devices) plugs in
at this one place without touching the process group.
"""
from __future__ import annotations

SUPPORTED_DEVICES = ("cpu",)


def check_devices(tensors, collective: str) -> None:
    """Raises NotImplementedError for a tensor on a device this build cannot stage."""
    for t in tensors:
        if t.device.type not in SUPPORTED_DEVICES:
            raise NotImplementedError(
                f"ftcomm backend: {collective} on {t.device.type} tensors is not supported yet "
                f"(supported devices: {', '.join(SUPPORTED_DEVICES)})")


def stage(tensors):
    """(host tensors, finish): the tensors to hand to the core, and a callable that copies the
    results back to the originals after a successful collective (a no-op for CPU tensors)."""
    return list(tensors), _nothing


def future_devices(tensors) -> list:
    """Devices a result future must know (non-empty only for device tensors)."""
    return []


def _nothing() -> None:
    return None
