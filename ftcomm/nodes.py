"""Which node each rank runs on, for node-aware buddy placement (issue 9).

A rank's node is, first found: ``FTCOMM_NODE`` (set it per node when the launcher cannot tell),
``FTCOMM_FAKE_NODE`` (set by mpi_configs/fake_node_rsh.sh when one machine plays several nodes),
else ``MPI_Get_processor_name()``. ``register(comm)`` gathers every rank's node name once
(collective, failure-free start-up) into ftcomm.shard's registry; from then on replicas go to
buddies on other nodes (ftcomm.shard.buddies), so that losing every rank of one node never loses
a shard. ``FTCOMM_NODE_AWARE=0`` turns it off (plain ring successors, as before issue 9).
"""
from __future__ import annotations

import os

import numpy as np

from . import shard

NAME_BYTES = 64
_TAG = 7401


def node_name() -> str:
    """This rank's node name (see the module docstring for the order of sources)."""
    for var in ("FTCOMM_NODE", "FTCOMM_FAKE_NODE"):
        if os.environ.get(var):
            return os.environ[var]
    from mpi4py import MPI

    return MPI.Get_processor_name()


def enabled() -> bool:
    return os.environ.get("FTCOMM_NODE_AWARE", "1") not in ("0", "false", "no", "off")


def gather(comm, timeout: float | None = None) -> dict:
    """``{world_rank: node name}`` over ``comm`` (collective; names cut to 64 bytes)."""
    raw = node_name().encode()[:NAME_BYTES]
    send = np.zeros(NAME_BYTES, np.uint8)
    send[: len(raw)] = np.frombuffer(raw, np.uint8)
    n, r = comm.size, comm.rank
    blocks = np.zeros((n, NAME_BYTES), np.uint8)
    blocks[r] = send
    for k in range(n - 1):  # ring allgather, one deadline-bounded exchange per step
        comm.exchange(sends=[((r + 1) % n, blocks[(r - k) % n])],
                      recvs=[((r - 1) % n, blocks[(r - k - 1) % n])], tag=_TAG, timeout=timeout)
    names = [bytes(b).rstrip(b"\0").decode(errors="replace") for b in blocks]
    return dict(zip(comm.world_ranks, names))


def register(comm, timeout: float | None = None) -> dict | None:
    """Gathers and records every rank's node (see ``gather``) unless FTCOMM_NODE_AWARE=0 or the
    registry already knows every rank of ``comm``. Returns the mapping in use, or None."""
    if not enabled():
        return None
    if shard.nodes_of(comm.world_ranks) is None:
        shard.register_nodes(gather(comm, timeout))
    return {w: n for w, n in zip(comm.world_ranks, shard.nodes_of(comm.world_ranks))}
