"""Fingerprints of state that must be equal on every rank (DDP's parameters and optimizer state),
compared across ranks to catch silent corruption at rest: a bit flipped in one rank's memory that
no checksum in transit can see.

Each rank hashes its arrays (XXH3-64, xxhash), the 64-bit digests are allgathered, and the
digest most ranks hold wins if it has a strict majority; the ranks holding another one are the
suspects. Without a strict majority (two ranks, or a split vote) nobody can tell which copy is
right, and the divergence is ambiguous.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import xxhash

from .buffers import raw as raw_buffer


def digest(arrays) -> int:
    """XXH3-64 over the bytes of ``arrays`` in order (contiguous numpy arrays or CPU tensors), as
    a signed int64 (for an int64 allgather)."""
    h = xxhash.xxh3_64()
    for a in arrays:
        address, nbytes = raw_buffer(a, writable=False)
        if nbytes:  # the bytes in place, no copy (numpy arrays and tensors alike)
            h.update(memoryview((ctypes.c_char * nbytes).from_address(address)))
    return int(np.uint64(h.intdigest()).astype(np.int64))


@dataclass
class Divergence:
    """Ranks whose fingerprints differ.

    Attributes:
        digests: every rank's digest, by rank of the communicator.
        majority: ranks holding the winning digest (empty when ambiguous).
        suspects: world ranks holding another digest (empty when ambiguous).
        world_ranks: the communicator's world ranks.
    """

    digests: list
    majority: list = field(default_factory=list)
    suspects: list = field(default_factory=list)
    world_ranks: list = field(default_factory=list)

    @property
    def ambiguous(self) -> bool:
        return not self.majority


def compare(comm, value: int, timeout: float | None = None) -> Divergence | None:
    """Allgathers every rank's ``value`` (from ``digest``) over ``comm``; None if all are equal.
    The result is the same on every rank.

    Raises:
        ProcFailedError, RevokedError, CollectiveTimeoutError: as ``Communicator.allgather`` (a
            local outcome: the caller's next collective sees the failure too).
    """
    mine = np.array([value], np.int64)
    every = np.empty(comm.size, np.int64)
    comm.allgather(mine, every, timeout=timeout)
    if np.all(every == every[0]):
        return None
    values, counts = np.unique(every, return_counts=True)
    out = Divergence(digests=every.tolist(), world_ranks=list(comm.world_ranks))
    best = int(np.argmax(counts))
    if counts[best] * 2 > comm.size and np.sum(counts == counts[best]) == 1:
        out.majority = [r for r in range(comm.size) if every[r] == values[best]]
        out.suspects = [comm.world_ranks[r] for r in range(comm.size) if every[r] != values[best]]
    return out
