"""Committed shards and replicas in node-local shared memory, where they outlive the job.

When a whole MPI job dies (a node lost, its daemon with it: docs/NODE_LOSS.md), every other node
still holds, in its ranks' memory, their committed shards and the replicas of the lost node's
shards (buddies are placed on other nodes). Held in private memory, all of it dies with the
processes; held in files under ``/dev/shm`` it stays on the node, and the job that
``ftcomm-run --restarts`` relaunches there resumes from it (``warm_resume.py``) instead of from
disk. The in-memory checkpoints of Gemini (Wang et al., SOSP'23) keep state in host memory
outside the training processes the same way; here no agent process and no extra copy are
needed: the buffers the sharded optimizer steps in *are* the segments. A torch loop with a plain
optimizer keeps its whole model and optimizer state in one segment the same way
(``ftcomm/torch/loop/model_memory.py``: ``ModelCopy``).

One segment per buffer (a live or staging shard, a replica, a model copy): a file

    <FTCOMM_SHM_DIR>/ftcomm-<uid>-<job>/<node>/L<launch>-W<world rank>-E<engine>-<n>.seg

  - ``job``: the ftcomm-run process that started the job (FTCOMM_LAUNCHER), the same for every
    relaunch of it and different for any other job; the directory is made with mode 0700 and
    files 0600, and a file whose owner is not this user is never read;
  - ``node``: the rank's node (``ftcomm.membership.nodes``; the made-up one under
    ``--fake-nodes``, so that the segments of a "lost" fake node can be removed as a real node's
    would be gone);
  - ``launch``: FTCOMM_RESTART, so that a relaunch tells its own segments from its
    predecessors';
  - ``engine``: which of the process's sharded optimizers, in the order the script made them.

Layout of a segment: a 4 KiB page with a magic number and the *commit word* (the step whose
committed state the segment holds, -1 for none), the replica header (``replica.py``'s JSON:
shard, step, layout, optimizer, scalars, metadata, XXH3-64 of the data), then the float32 data.
The commit word is written only after the step's agreement, once the data and header are
complete, and cleared before the buffer is written again, so a reader after a crash can tell a
committed state from one that was half written; the checksum catches the rest.
"""
from __future__ import annotations

import itertools
import mmap
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from .. import settings
from ..segment_paths import node_dir
from . import storage
from .replica import HEADER_BYTES, Replica, checksum, decode_header, pack_header

MAGIC = b"FTCSEG01"
PAGE = 4096
HEADER_OFFSET = PAGE
DATA_OFFSET = PAGE + HEADER_BYTES  # page-aligned: HEADER_BYTES is a multiple of the page size
_NAME = re.compile(r"^L(\d+)-W(\d+)-E(\d+)-(\d+)\.seg$")
_ENGINES = itertools.count()  # NodeMemory objects made by this process, in order


class _Segment:
    """One mapped segment file: the commit word, the header and the data."""

    def __init__(self, path: str, elements: int, used: int):
        """Creates the file ``path`` (it must not exist) for ``elements`` float32 values, the
        memory of the first ``used`` of them reserved."""
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size = DATA_OFFSET + 4 * max(elements, 1)
            os.ftruncate(fd, size)
            self.used = 0
            self._reserve(fd, used)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.map[:8] = MAGIC
        self.words = np.frombuffer(self.map, np.int64, 4, 0)
        self.words[1] = -1
        self.words[2] = elements
        self.header = np.frombuffer(self.map, np.uint8, HEADER_BYTES, HEADER_OFFSET)
        self.data = np.frombuffer(self.map, np.float32, elements, DATA_OFFSET)

    def _reserve(self, fd: int, used: int) -> None:
        # The memory under what is written is reserved before it is touched: a tmpfs that is full
        # would otherwise raise SIGBUS at the first touch of a page, in the middle of a step. The
        # room to grow after a shrink (``storage.py``) is reserved only when a buffer grows into
        # it: reserving it up front doubled the memory of a 2-rank job's segments, and the time
        # to allocate a relaunch's new replicas.
        if used > self.used:
            os.posix_fallocate(fd, 0, DATA_OFFSET + 4 * used)
            self.used = used

    def reserve(self, used: int) -> None:
        """Reserves the memory of the first ``used`` values (OSError: the tmpfs cannot hold it)."""
        if used > self.used:
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._reserve(fd, used)
            finally:
                os.close(fd)

    def mark(self, step: int, header: np.ndarray | None = None) -> None:
        if header is not None and header is not self.header:
            self.words[1] = -1
            self.header[:] = header
        self.words[1] = step

    def unmark(self) -> None:
        self.words[1] = -1


class NodeMemory:
    """Allocates this rank's shard and replica buffers as segments, and marks them committed.

    Args:
        directory: this node's segment directory of this job (``node_dir``).
        world_rank, launch: this process's world rank and FTCOMM_RESTART.
    """

    def __init__(self, directory: str, world_rank: int, launch: int):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.directory, self.world_rank, self.launch = directory, world_rank, launch
        # Which of this process's optimizers it serves (0 for the first made): the same on every
        # rank and launch of a script, so a relaunch takes each optimizer's copies for it alone.
        self.engine = next(_ENGINES)
        self._segments: dict[int, _Segment] = {}  # address of the data -> its segment
        self._count = 0
        self._blobs: dict[str, list] = {}  # name -> its two segments (put_blob)
        self._blob_turn: dict[str, int] = {}
        self._full = False  # the tmpfs refused a segment (said once)
        from ..core import runtime

        # A clean exit removes this process's segments; a crash leaves them to the relaunch, unless
        # ftcomm-run itself is gone (nobody will relaunch).
        runtime.at_shutdown(lambda crashed: None if crashed else self.close())
        runtime.when_launcher_gone(self.close)

    @classmethod
    def for_rank(cls, world_rank: int) -> "NodeMemory | None":
        """This rank's node memory, or None when off (FTCOMM_WARM=0, or outside ftcomm-run)."""
        if not settings.warm_restart():
            return None
        from ..membership.nodes import node_name

        directory = node_dir(node_name())
        return None if directory is None else cls(directory, world_rank, settings.restart_count())

    def _new(self, elements: int, used: int) -> _Segment | None:
        """A new segment of ``elements`` values, ``used`` of them reserved, or None when the
        node's tmpfs cannot hold it (said once: the buffer then goes to private memory)."""
        self._count += 1
        path = os.path.join(self.directory, f"L{self.launch}-W{self.world_rank}-E{self.engine}-{self._count}.seg")
        try:
            segment = _Segment(path, elements, used)
        except OSError as error:
            try:
                os.unlink(path)
            except OSError:
                pass
            self._say_full(4 * used, error)
            return None
        self._segments[segment.data.ctypes.data] = segment
        return segment

    def _say_full(self, nbytes: int, error: OSError) -> None:
        """Says once on stderr that the tmpfs refused ``nbytes`` more: buffers then go to private
        memory, and a relaunch finds this rank's copies only in its buddies' memory or on disk."""
        if not self._full:
            self._full = True
            print(f"ftcomm: world rank {self.world_rank}: node memory {self.directory} cannot hold "
                  f"{nbytes} more bytes ({error.strerror}): new buffers go to private "
                  "memory (a larger tmpfs in FTCOMM_SHM_DIR keeps them for a relaunch; FTCOMM_WARM=0 turns "
                  "node memory off)", file=sys.stderr, flush=True)

    def zeros(self, n: int, used: int | None = None) -> np.ndarray:
        """A zeroed float32 array of ``n`` elements in a new segment, the memory of the first
        ``used`` (default all) reserved, else in private memory (``storage.allocate``'s
        ``zeros``; a buffer that grows later calls ``reserve``)."""
        segment = self._new(n, n if used is None else used)
        return np.zeros(n, np.float32) if segment is None else segment.data

    def replica_buffer(self, shape: tuple, capacity: int) -> Replica:
        """A replica's header and state, both in one new segment (else in private memory)."""
        used = int(np.prod(shape))
        segment = self._new(max(used, capacity), used)
        if segment is None:
            return Replica(np.zeros(HEADER_BYTES, np.uint8), storage.allocate(shape, capacity))
        return Replica(segment.header, segment.data[:used].reshape(shape))

    def reserve(self, array: np.ndarray) -> bool:
        """``array``, a view of the start of a segment's data (or private memory) that a buffer
        now uses (``storage.reuse``), is about to be written: the memory under it is reserved.
        False when the tmpfs cannot hold it (said once): the caller allocates elsewhere."""
        segment = self._segment_of(array)
        if segment is not None:
            try:
                segment.reserve(array.size)
            except OSError as error:
                self._say_full(4 * (array.size - segment.used), error)
                return False
        return True

    def _segment_of(self, array: np.ndarray) -> _Segment | None:
        return self._segments.get(storage.storage(array).ctypes.data)

    def mark(self, array: np.ndarray, step: int, header: np.ndarray | None = None) -> None:
        """``array`` (a segment's data, or a view of its start) holds the committed state of
        ``step``, described by ``header`` (copied into the segment unless it already is there)."""
        segment = self._segment_of(array)
        if segment is not None:
            segment.mark(step, header)

    def unmark(self, array: np.ndarray) -> None:
        """``array``'s segment is about to be written: no longer a committed state."""
        segment = self._segment_of(array)
        if segment is not None:
            segment.unmark()

    def put_blob(self, name: str, step: int, data: bytes) -> None:
        """Keeps ``data`` (bytes: what a layer above needs besides the shards, e.g. the torch
        loop's position and RNG) as this rank's committed blob ``name`` of ``step``. Two segments
        per name take turns, so the previous step's blob stays whole while this one is written."""
        slots = self._blobs.setdefault(name, [None, None])
        turn = self._blob_turn.get(name, 0)
        self._blob_turn[name] = 1 - turn
        segment = slots[turn]
        elements = -(-len(data) // 4)
        if segment is None or segment.words[2] < elements:
            if segment is not None:
                self._drop(segment)
            size = max(elements, 1024)  # a blob is small: its whole segment is reserved
            segment = slots[turn] = self._new(size, size)
            if segment is None:
                return  # no room: this step's blob is not kept (a relaunch resumes from disk)
        segment.unmark()
        raw = np.frombuffer(data, np.uint8)
        segment.data.view(np.uint8)[: len(raw)] = raw
        meta = {"blob": name, "engine": self.engine, "step": step, "world_rank": self.world_rank, "nbytes": len(raw),
                "xxh3": checksum(raw)}
        segment.mark(step, pack_header(meta))

    def release(self, array: np.ndarray) -> None:
        """Removes the segment of ``array`` (a buffer this process no longer uses)."""
        segment = self._segment_of(array)
        if segment is not None:
            self._drop(segment)

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array`` lies in one of this process's segments (not private memory)."""
        return self._segment_of(array) is not None

    def _drop(self, segment: _Segment) -> None:
        self._segments.pop(segment.data.ctypes.data, None)
        try:
            os.unlink(segment.path)
        except OSError:
            pass

    def close(self) -> None:
        """Removes this process's segments (the job ended normally)."""
        for segment in list(self._segments.values()):
            self._drop(segment)


@dataclass
class _Found:
    """A committed segment that ``scan`` found: its path, the launch that wrote it, its header."""

    path: str
    launch: int
    meta: dict

    @property
    def step(self) -> int:
        return int(self.meta["step"])


class Blob(_Found):
    """A committed blob (``NodeMemory.put_blob``): ``meta`` has blob (its name), engine, step,
    world_rank, nbytes, xxh3."""

    def read(self) -> bytes | None:
        """The blob's bytes, or None when the segment no longer holds it whole."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(DATA_OFFSET)
                data = f.read(int(self.meta["nbytes"]))
        except (OSError, ValueError):
            return None
        if len(head) < DATA_OFFSET or int(np.frombuffer(head, np.int64, 1, 8)[0]) != self.step:
            return None
        raw = np.frombuffer(data, np.uint8)
        return data if len(raw) == self.meta["nbytes"] and checksum(raw) == self.meta["xxh3"] else None


class ModelCopy(_Found):
    """A committed copy of a whole model and its optimizer's state (``ftcomm.torch``'s
    ``ModelMemory``, a DDP loop's): ``meta`` has model (the engine), step, world_rank,
    world_size, nbytes, xxh3, layout_offset, layout_nbytes."""

    def data(self) -> np.ndarray | None:
        """The copy's bytes (uint8[nbytes]), read-only and mapped, or None when the segment no
        longer holds that committed state or its checksum is wrong."""
        try:
            with open(self.path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        nbytes = int(self.meta["nbytes"])
        if len(mapped) < DATA_OFFSET + nbytes or int(np.frombuffer(mapped, np.int64, 1, 8)[0]) != self.step:
            return None
        data = np.frombuffer(mapped, np.uint8, nbytes, DATA_OFFSET)
        return data if checksum(data) == self.meta["xxh3"] else None


class Copy(_Found):
    """A committed copy of a shard: ``meta`` is its header (shard, step, numel, shard_len, size,
    slots, optimizer, engine, scalars, extra, xxh3, nbytes)."""

    @property
    def shard(self) -> int:
        return int(self.meta["shard"])

    def header(self) -> np.ndarray:
        """The segment's header bytes (uint8[HEADER_BYTES]), as they were when listed or later."""
        with open(self.path, "rb") as f:
            f.seek(HEADER_OFFSET)
            return np.frombuffer(f.read(HEADER_BYTES), np.uint8).copy()

    def state(self) -> np.ndarray | None:
        """The shard's data ``(slots, shard_len)``, read-only and mapped, or None when the segment
        no longer holds that committed state or its checksum is wrong."""
        try:
            with open(self.path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            slots, shard_len = int(self.meta["slots"]), int(self.meta["shard_len"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if len(mapped) < DATA_OFFSET + 4 * slots * shard_len:  # a truncated file
            return None
        words = np.frombuffer(mapped, np.int64, 4, 0)
        if words[1] != self.step or slots * shard_len > words[2]:
            return None
        state = np.frombuffer(mapped, np.float32, slots * shard_len, DATA_OFFSET).reshape(slots, shard_len)
        if self.meta.get("nbytes") != state.nbytes or self.meta.get("xxh3") != checksum(state):
            return None
        return state


def scan(directory: str | None, before_launch: int) -> list[Copy]:
    """The committed copies of shards in a node's segment directory written by launches before
    ``before_launch`` (a relaunch's predecessors), owned by this user; headers only (the data is
    checked by ``Copy.state``)."""
    return [found for found in _scan(directory, before_launch) if isinstance(found, Copy)]


def scan_blobs(directory: str | None, before_launch: int, name: str, engine: int) -> list[Blob]:
    """The committed blobs ``name`` of optimizer ``engine`` in a node's segment directory, as
    ``scan`` finds copies."""
    return [found for found in _scan(directory, before_launch) if isinstance(found, Blob)
            and found.meta["blob"] == name and found.meta.get("engine") == engine]


def scan_models(directory: str | None, before_launch: int, engine: int) -> list[ModelCopy]:
    """The committed model copies of engine ``engine`` in a node's segment directory, newest
    step first, as ``scan`` finds copies of shards."""
    found = [f for f in _scan(directory, before_launch) if isinstance(f, ModelCopy) and f.meta["model"] == engine]
    return sorted(found, key=lambda f: -f.step)


def _scan(directory: str | None, before_launch: int) -> list:
    if directory is None or not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        match = _NAME.match(name)
        if match is not None and int(match.group(1)) < before_launch:
            one = found_at(os.path.join(directory, name))
            if one is not None:
                found.append(one)
    return found


def found_at(path: str) -> "Copy | Blob | ModelCopy | None":
    """The committed segment at ``path`` (named as this module names them, owned by this user,
    its header whole and marked with its step), headers only; else None."""
    match = _NAME.match(os.path.basename(path))
    if match is None:
        return None
    try:
        if os.stat(path).st_uid != os.getuid():
            return None
        with open(path, "rb") as f:
            head = f.read(DATA_OFFSET)
    except OSError:
        return None
    if len(head) < DATA_OFFSET or head[:8] != MAGIC:
        return None
    step = int(np.frombuffer(head, np.int64, 1, 8)[0])
    meta = decode_header(np.frombuffer(head, np.uint8, HEADER_BYTES, HEADER_OFFSET))
    if step < 0 or not meta or meta.get("step") != step:
        return None
    for kind, fields in ((Blob, BLOB_FIELDS), (ModelCopy, MODEL_FIELDS), (Copy, COPY_FIELDS)):
        if _fields(meta, fields):
            return kind(path, int(match.group(1)), meta)
    return None


# What a header must hold to be used (its digest already checked by decode_header).
COPY_FIELDS = {"shard": int, "step": int, "numel": int, "shard_len": int, "size": int, "slots": int,
               "optimizer": str, "nbytes": int, "xxh3": int}
BLOB_FIELDS = {"blob": str, "step": int, "world_rank": int, "nbytes": int, "xxh3": int}
MODEL_FIELDS = {"model": int, "step": int, "world_rank": int, "world_size": int, "nbytes": int, "xxh3": int,
                "layout_offset": int, "layout_nbytes": int}


def _fields(meta: dict, fields: dict) -> bool:
    return all(isinstance(meta.get(name), kind) and not isinstance(meta.get(name), bool) for name, kind in fields.items())


def remove_earlier_launches(directory: str | None, launch: int) -> int:
    """Deletes the segments of launches before ``launch`` in a node's directory (after a
    relaunch resumed, or found nothing to resume from); returns how many."""
    removed = 0
    if directory is None or not os.path.isdir(directory):
        return 0
    for name in os.listdir(directory):
        match = _NAME.match(name)
        if match is not None and int(match.group(1)) < launch:
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError as error:
                print(f"ftcomm: could not remove {name}: {error}", file=sys.stderr)
    return removed
