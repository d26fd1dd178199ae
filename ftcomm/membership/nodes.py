"""Which node each rank runs on, for node-aware buddy placement.

A rank's node is, first found: ``FTCOMM_NODE`` (set it per node when the launcher cannot tell),
``FTCOMM_FAKE_NODE`` (set by mpi_configs/fake_node_rsh.sh when one machine plays several nodes),
else ``MPI_Get_processor_name()``. ``register(comm)`` gathers every rank's node name once
(collective, failure-free start-up) into this module's registry; from then on the training layer
places replicas on buddies on other nodes (``ftcomm.training.buddies``), so that losing every
rank of one node never loses a shard. ``FTCOMM_NODE_AWARE=0`` turns it off (plain ring
successors).
"""
from __future__ import annotations

import numpy as np

from .. import settings

NAME_BYTES = 64

# World rank -> node name, the same on every rank (filled by one collective, ``register``).
_NODE_OF_WORLD: dict = {}


def node_name() -> str:
    """This rank's node name (see the module docstring for the order of sources)."""
    override = settings.node_name_override()
    if override:
        return override
    from mpi4py import MPI

    return MPI.Get_processor_name()


def record(mapping: dict) -> None:
    """Records the node of each world rank (``{world_rank: node_name}``). Call it with the same
    mapping on every rank (``register`` gathers it collectively)."""
    _NODE_OF_WORLD.update({int(w): str(n) for w, n in mapping.items()})


def nodes_of(world_ranks) -> tuple | None:
    """Node of each world rank in ``world_ranks``, or None if any is unknown."""
    try:
        return tuple(_NODE_OF_WORLD[int(w)] for w in world_ranks)
    except KeyError:
        return None


def gather(comm, timeout: float | None = None) -> dict:
    """``{world_rank: node name}`` over ``comm`` (collective; names cut to 64 bytes)."""
    raw = node_name().encode()[:NAME_BYTES]
    send = np.zeros(NAME_BYTES, np.uint8)
    send[: len(raw)] = np.frombuffer(raw, np.uint8)
    table = np.zeros((comm.size, NAME_BYTES), np.uint8)
    comm.allgather(send, table, timeout=timeout)
    names = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in table]
    return dict(zip(comm.world_ranks, names))


def register(comm, timeout: float | None = None) -> dict | None:
    """Gathers and records every rank's node (see ``gather``) unless FTCOMM_NODE_AWARE=0 or the
    registry already knows every rank of ``comm``. Returns the mapping in use, or None."""
    if not settings.node_aware():
        return None
    if nodes_of(comm.world_ranks) is None:
        record(gather(comm, timeout))
    return dict(zip(comm.world_ranks, nodes_of(comm.world_ranks)))
