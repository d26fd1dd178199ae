"""In-memory replicas of shards in the host memory of buddy ranks.

Each rank sends its shard (a ``(slots, shard_len)`` float32 array: parameters and optimizer
state) plus a fixed-size header (step, shard id, checksum, and free-form metadata such as the data
position and RNG state) to its ``k`` ring successors, its buddies (buddy checkpointing as in Fenix,
Gamell et al. SC'14; peer CPU memory as in Gemini, Wang et al. SOSP'23).

Double buffer: replicas arrive into a *pending* set; the caller turns it into the *committed* set
only after an agreement says every rank's pending set is complete (``commit``). Until then the
previous committed set stays intact, so a recovery always finds one complete, checksummed
generation. Memory: ``k x shard bytes`` committed plus ``k x shard bytes`` pending (the pending
buffers are recycled from the previous generation, so steady state holds ``2k`` shard buffers,
each allocated with room for the larger shards after a shrink: ``storage.py``).

Only the optimizer-state slots cross the network: every rank already receives its wards' new
parameters in the step's allgather (ZeRO-1 gathers every shard everywhere), so a replica's
parameter slot is copied from the gathered parameters instead of being sent twice (a third of
the bytes for AdamW, half for SGD with momentum).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import xxhash

from ..core.codes import Tag
from ..errors import SilentCorruptionError
from ..membership.nodes import nodes_of
from . import storage
from .buddies import buddies, wards

HEADER_BYTES = 32 * 1024  # fixed, so that receivers know every message size in advance


def checksum(state: np.ndarray) -> int:
    """XXH3-64 (xxhash) of the array's bytes; ``state`` must be C-contiguous. Five to seven times
    faster than zlib's CRC-32 here (20 ms against 120 ms for 300 MB), and it runs on every step."""
    return xxhash.xxh3_64_intdigest(memoryview(state).cast("B"))


def encode_header(meta: dict, state: np.ndarray) -> np.ndarray:
    """A ``HEADER_BYTES`` uint8 array holding ``meta`` plus the state's checksum and byte count
    (``pack_header``).

    Raises:
        ValueError: ``meta`` does not fit in ``HEADER_BYTES`` (keep it small: steps, positions,
            RNG states; not tensors).
    """
    return pack_header(dict(meta, xxh3=checksum(state), nbytes=int(state.nbytes)))


def pack_header(meta: dict) -> np.ndarray:
    """``meta`` as JSON, a newline and the JSON's own XXH3-64 in hex, zero-padded to
    ``HEADER_BYTES``: a flipped bit in the header (a step, a data position) is caught, as the
    data's checksum catches one in the data.

    Raises:
        ValueError: it does not fit.
    """
    raw = json.dumps(meta, separators=(",", ":")).encode()  # escapes newlines inside strings
    raw += b"\n" + f"{xxhash.xxh3_64_intdigest(raw):016x}".encode()
    if len(raw) > HEADER_BYTES:
        raise ValueError(f"replica header of {len(raw)} bytes exceeds {HEADER_BYTES}")
    out = np.zeros(HEADER_BYTES, np.uint8)
    out[: len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_header(header: np.ndarray) -> dict | None:
    """The metadata of a packed header, or None if it cannot be read or its digest is wrong
    (corrupted)."""
    body, _, digest = header.tobytes().rstrip(b"\0").rpartition(b"\n")
    try:
        if int(digest, 16) != xxhash.xxh3_64_intdigest(body):
            return None
        meta = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


@dataclass
class Replica:
    """A copy of one shard: ``header`` (uint8[HEADER_BYTES]) and ``state`` (float32
    ``(slots, shard_len)``)."""

    header: np.ndarray
    state: np.ndarray

    @property
    def meta(self) -> dict | None:
        return decode_header(self.header)

    def is_valid(self, shard: int, step: int) -> bool:
        """True when the header is readable, names ``shard`` and committed ``step``, and the
        state's checksum and size match the header."""
        meta = self.meta
        return (meta is not None and meta.get("shard") == shard and meta.get("step") == step
                and meta.get("nbytes") == self.state.nbytes and meta.get("xxh3") == checksum(self.state))


class ReplicaStore:
    """The replicas one rank keeps for its wards (ring predecessors), double-buffered.

    Args:
        replicas: k, buddies per shard (capped at world size - 1).
    """

    def __init__(self, replicas: int = 1, memory=None):
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, not {replicas}")
        self.replicas = replicas
        # Where new replica buffers come from: node-local shared memory (``node_memory.py``),
        # whose commit word ``commit`` sets, or private memory (None).
        self.memory = memory
        self.committed: dict[int, Replica] = {}  # shard id -> replica of the last committed step
        self.pending: dict[int, Replica] = {}
        # XXH3-64 of this rank's own shard as its buddies received it, committed generation and
        # pending one: what the owner's live shard must still hash to (``ShardedOptimizer.check_state``).
        self.own_digest: int | None = None
        self._own_digest_pending: int | None = None
        self._pool: list[Replica] = []  # spare buffers from an older generation

    def _buffer(self, shape, capacity: int = 0) -> Replica:
        """A free replica buffer of ``shape``: a recycled one whose memory is large enough (one
        too small is dropped), else a new one of at least ``capacity`` elements."""
        while self._pool:
            spare = self._pool.pop()
            state = storage.reuse(spare.state, shape)
            if state is not None and (self.memory is None or self.memory.reserve(state)):
                if self.memory is not None:
                    self.memory.unmark(state)  # about to be overwritten: no longer a committed copy
                return Replica(spare.header, state)
        if self.memory is not None:
            return self.memory.replica_buffer(shape, capacity)
        return Replica(np.zeros(HEADER_BYTES, np.uint8), storage.allocate(shape, capacity))

    def replicate(self, comm, header: np.ndarray, state: np.ndarray, params: np.ndarray, timeout=None,
                  on_node=None) -> int:
        """Sends this rank's shard to its buddies and receives its wards' shards into the pending
        set, all in one ``exchange`` (so the k sends and k receives overlap).

        Args:
            comm: the Communicator; shard id = rank.
            header: from ``encode_header``; state: float32 ``(slots, shard_len)``, C-contiguous.
            params: the flat parameters, already holding every shard's new slot 0 (after the
                step's allgather): each ward's parameter slot is copied from here, not sent.
            on_node: after a relaunch, the copies the buddies' own nodes still hold
                (``warm_resume.NodeReplicas``: ``holds(ward, buddy)``, ``fill(ward, state)``): a
                ward's optimizer slots that its buddy's node holds whole are copied there from
                those segments instead of being sent (only the header travels), then checked
                against the header's checksum.

        Returns:
            Bytes this rank sent (``k x (HEADER_BYTES + state[1:].nbytes)``, less the slots the
            buddies' nodes held).

        Raises:
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``Communicator.exchange``
            (local outcome; the caller agrees afterwards). The committed set is untouched.
            SilentCorruptionError: a replica copied on the node differs from its owner's shard.
        """
        self.discard_pending()
        self._own_digest_pending = (decode_header(header) or {}).get("xxh3")
        rank, size = comm.rank, comm.size
        nodes = nodes_of(comm.world_ranks)  # node-aware placement once nodes are registered
        shard_len = state.shape[1]
        capacity = state.shape[0] * storage.grown_len(shard_len, size)
        held_by = on_node.holds if on_node is not None and len(state) > 1 else (lambda ward, buddy: False)
        sends, recvs, copied = [], [], []
        for peer in buddies(rank, size, self.replicas, nodes):
            sends.append((peer, header))
            if len(state) > 1 and not held_by(rank, peer):
                sends.append((peer, state[1:]))
        for ward in wards(rank, size, self.replicas, nodes):
            slot = self._buffer(state.shape, capacity)
            self.pending[ward] = slot
            slot.state[0] = params[ward * shard_len:(ward + 1) * shard_len]
            recvs.append((ward, slot.header))
            if held_by(ward, rank):
                on_node.fill(ward, slot.state)
                copied.append(ward)
            elif len(state) > 1:
                recvs.append((ward, slot.state[1:]))
        comm.exchange(sends=sends, recvs=recvs, tag=Tag.REPLICA, timeout=timeout)
        for ward in copied:
            if checksum(self.pending[ward].state) != (decode_header(self.pending[ward].header) or {}).get("xxh3"):
                raise SilentCorruptionError(f"world rank {comm.world_rank}: the replica of shard {ward} copied from "
                                            "this node's segments differs from its owner's shard",
                                            checked="replica checksum")
        return sum(array.nbytes for _, array in sends)

    def commit(self, step: int | None = None) -> None:
        """The pending set becomes the committed one (call once an agreement confirmed that every
        rank's pending set is complete); the old committed buffers are kept for reuse. ``step``:
        the committed step the pending replicas hold, which their node-memory segments are
        marked with (none are without it)."""
        self._pool.extend(self.committed.values())
        self.committed, self.pending = self.pending, {}
        self.own_digest, self._own_digest_pending = self._own_digest_pending, None
        if self.memory is not None and step is not None:
            for replica in self.committed.values():
                self.memory.mark(replica.state, step, replica.header)

    def discard_pending(self) -> None:
        """Drops an incomplete pending set (after an aborted step); the committed set stays."""
        self._pool.extend(self.pending.values())
        self.pending = {}
        self._own_digest_pending = None

    def get(self, shard: int) -> Replica | None:
        """The committed replica of ``shard``, if this rank keeps one."""
        return self.committed.get(shard)

    @property
    def nbytes(self) -> int:
        """Host bytes held by replicas: committed + pending + spare buffers, with their room to
        grow."""
        every = [*self.committed.values(), *self.pending.values(), *self._pool]
        return sum(r.header.nbytes + storage.storage(r.state).nbytes for r in every)
