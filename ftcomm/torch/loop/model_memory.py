"""A DDP loop's model and optimizer state, in place in node-local shared memory, so that a
relaunched job resumes from it (``warm.py``) as a ZeRO loop resumes from its shards.

With a plain torch optimizer every rank holds the whole state: the parameters and the
optimizer's per-parameter tensors (Adam's moments and step counts). At the loop's first applied
step ``ModelMemory`` copies them, once, into one segment of the rank's node memory
(``training/node_memory.py``) and points the parameters (``p.data``) and the optimizer's state
at views of it: from then on the optimizer updates the segment itself, and a step costs no copy.
The segment's layout (which tensor lies where, the state's non-tensor values) is pickled after
the tensors; a change of it (a disk resume loads new tensors, a parameter gets its first state)
moves the state into a new segment at the next commit.

The commit word follows the step (``NodeMemory``): cleared by the optimizer's step pre-hook
before the in-place update (after the loop's own hook, which voids a failed step: a voided step
updates nothing and clears nothing), set after the applied step once the segment's XXH3-64 is
in its header. The checksum runs in a thread, beside the next step's forward and backward (xxhash
releases the GIL); the next update waits for it. So a job killed while the update or the
checksum runs leaves that rank's copy unmarked: the DDP ranks update together, so a relaunch
then finds no whole copy of the newest step and resumes from disk (said on stderr).

On a relaunch ``resume_from_memory`` (collective) lists the copies on each node (the node's ranks
read and check them in turn), agrees on the newest step some rank holds whole, and broadcasts
that copy from the lowest such rank into a new segment on every rank, whose views then become
the parameters and the optimizer's state: the copy a rank resumes from is the one it steps in.
Models on a GPU are not kept (their state is not in host memory): such a loop resumes from disk.
"""
from __future__ import annotations

import pickle
import sys
import threading
import time

import numpy as np
import torch

from ... import settings
from ...core.outcome import agreed
from ...membership import nodes
from ...training import node_memory
from ...training.replica import checksum, pack_header
from ...training.warm_resume import allgather_json, node_ranks, remove_earlier
from ..group.step_state import step_voided

ALIGN = 64  # bytes between tensors in a segment: any dtype's view stays aligned


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _entries(optimizer) -> tuple[list, dict]:
    """(tensors: [(param index, state key or None for the parameter, tensor)], values: {(param
    index, key): a non-tensor state value}), in a fixed order (param groups', then keys sorted)."""
    tensors, values = [], {}
    for index, p in enumerate(_params(optimizer)):
        tensors.append((index, None, p.data))
        for key in sorted(optimizer.state.get(p, {}), key=str):
            value = optimizer.state[p][key]
            if isinstance(value, torch.Tensor):
                tensors.append((index, key, value))
            else:
                values[(index, key)] = value
    return tensors, values


def _layout(tensors: list, values: dict) -> tuple[list, int]:
    """([(param index, key, dtype name, shape, byte offset)], bytes the tensors take)."""
    out, offset = [], 0
    for index, key, tensor in tensors:
        out.append((index, key, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return out, offset


def _views(data: np.ndarray, layout: list) -> list:
    """Tensors viewing ``data`` (uint8) as ``layout`` places them."""
    out = []
    for _, _, dtype, shape, offset in layout:
        kind = getattr(torch, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=kind).element_size()
        raw = torch.from_numpy(data[offset: offset + nbytes]) if nbytes else torch.empty(0, dtype=torch.uint8)
        out.append(raw.view(kind).view(shape))
    return out


class ModelMemory:
    """The model's parameters and ``optimizer``'s state (a plain ``torch.optim.Optimizer``) in a
    segment of ``memory`` (see the module docstring).

    Args:
        optimizer: the loop's optimizer, over CPU parameters.
        memory: this rank's ``NodeMemory``.
    """

    def __init__(self, optimizer, memory):
        self.optimizer, self.memory = optimizer, memory
        self.committed_step = 0
        self._hold(None)       # _words / _data: the segment's data as float32 / bytes, or None
        self._views = []       # the tensors the model and optimizer use, in layout order
        self._values = {}
        self._layout_place = (0, 0)  # (byte offset, bytes) of the pickled layout
        self._written_at = (0, 1)   # (world rank, world size) the copy was written at
        self._sealing = None   # the thread checksumming the committed state
        optimizer.register_step_pre_hook(self._before_update)

    def _hold(self, words: np.ndarray | None) -> None:
        """The segment in use: ``words`` (its float32 data) and ``_data``, its bytes (None: none)."""
        self._words, self._data = words, None if words is None else words.view(np.uint8)

    # -- steady state --------------------------------------------------------------------------
    def commit(self, step: int, world_rank: int, world_size: int) -> None:
        """After applied step ``step`` (every rank, no communication): the state, in its segment,
        is marked committed once its checksum is in the header (in a thread)."""
        self._wait()
        if not self._in_place():
            self._adopt()
        if self._data is None:
            return  # no room in the node's memory: nothing is kept
        self.committed_step, self._written_at = step, (world_rank, world_size)
        self._sealing = threading.Thread(target=self._seal, args=(step,), name="ftcomm-model-memory", daemon=True)
        self._sealing.start()

    def _seal(self, step: int, digest: int | None = None) -> None:
        layout_offset, layout_nbytes = self._layout_place
        nbytes = layout_offset + layout_nbytes
        meta = {"model": self.memory.engine, "step": step, "world_rank": self._written_at[0], "world_size": self._written_at[1],
                "nbytes": nbytes, "xxh3": checksum(self._data[:nbytes]) if digest is None else digest,
                "layout_offset": layout_offset, "layout_nbytes": layout_nbytes}
        self.memory.mark(self._words, step, pack_header(meta))

    def _wait(self) -> None:
        if self._sealing is not None:
            self._sealing.join()
            self._sealing = None

    def _before_update(self, optimizer, args, kwargs):
        """The optimizer's step pre-hook: the update is about to write the segment."""
        if self._data is not None and not step_voided():
            self._wait()
            self.memory.unmark(self._words)

    def _in_place(self) -> bool:
        """Whether the model and optimizer still use exactly this segment's views."""
        tensors, values = _entries(self.optimizer)
        return (self._data is not None and len(tensors) == len(self._views) and values == self._values
                and all(t.data_ptr() == v.data_ptr() and t.shape == v.shape and t.dtype == v.dtype
                        for (_, _, t), v in zip(tensors, self._views)))

    def _adopt(self) -> None:
        """Moves the state into a new segment (one copy) and points the model and optimizer at it."""
        tensors, values = _entries(self.optimizer)
        if any(t.device.type != "cpu" for _, _, t in tensors):
            return  # a model on a GPU: not kept
        layout, size = _layout(tensors, values)
        data = self._new(layout, values, size)
        if data is None:
            return
        for (_, _, tensor), view in zip(tensors, self._views):
            view.copy_(tensor)
        self._point(layout)

    def _new(self, layout: list, values: dict, size: int) -> np.ndarray | None:
        """A new segment for ``layout``'s tensors and the pickled layout (the old one removed);
        None without room."""
        described = pickle.dumps({"layout": layout, "values": values})
        words = self.memory.zeros(-(-(size + len(described)) // 4))
        self._drop()  # the tensors still viewing it stay readable: the mapping outlives the file
        if not self.memory.holds(words):
            return None
        self._hold(words)
        self._data[size: size + len(described)] = np.frombuffer(described, np.uint8)
        self._layout_place, self._values = (size, len(described)), values
        self._views = _views(self._data, layout)
        return self._data

    def _point(self, layout: list) -> None:
        """The parameters and the optimizer's state become the segment's views."""
        params = _params(self.optimizer)
        for (index, key, *_), view in zip(layout, self._views):
            if key is None:
                params[index].data = view
            else:
                self.optimizer.state[params[index]][key] = view
        for (index, key), value in self._values.items():
            self.optimizer.state[params[index]][key] = value

    def _drop(self) -> None:
        if self._data is not None:
            self._wait()
            self.memory.release(self._words)
            self._hold(None)
            self._views = []

    # -- the loop's warm tier (warm.py) ----------------------------------------------------------
    @property
    def node_memory(self):
        return self.memory

    def resume_from_memory(self, comm, log=None, eligible=None, fetch=None, timeout: float | None = None):
        """On a relaunch (FTCOMM_RESTART > 0): the newest step whose model copy some rank's node
        holds whole and that is in ``eligible`` (None: any), made the model's and optimizer's
        state on every rank of ``comm``. ``fetch(step)``: the caller's own state of that step,
        collective, before anything changes (returned as "fetched"). Collective.

        Returns:
            None when there is nothing to resume from, else {"step", "from_world_size",
            "fetched", "bytes_read" (this rank's copies checked), "bytes_moved" (the copy's bytes
            times the ranks it went to), "phases": {"list_s", "agree_s", "move_s", "finish_s"}}.
        Raises:
            ProcFailedError etc.: a rank failed, on every rank; nothing changed.
        """
        launch = settings.restart_count()
        if launch == 0:
            return None
        t0 = time.perf_counter()
        with agreed(comm, "warm resume: listing the nodes' model copies", timeout=timeout):
            table = nodes.gather(comm, timeout)
            local = node_ranks(comm, table)
            held = {}
            copies = node_memory.scan_models(self.memory.directory, launch, self.memory.engine)
            for copy in copies[local.index(comm.rank)::len(local)]:
                if copy.step in held or (eligible is not None and copy.step not in eligible):
                    continue
                data = copy.data()
                if data is not None:
                    held[copy.step] = (copy, data)
            everything = allgather_json(comm, [[step, copy.meta["nbytes"]] for step, (copy, _) in held.items()],
                                        timeout)
        t1 = time.perf_counter()
        holders = {}
        for rank, entries in enumerate(everything):
            for step, nbytes in entries:
                holders.setdefault((step, nbytes), rank)
        if not holders:
            remove_earlier(self.memory, comm, launch, table)
            if comm.rank == 0 and copies:
                print("ftcomm: the nodes' memory holds no whole copy of the model of a step the loop can resume "
                      "(every rank was updating it, or it is damaged): the disk checkpoint (if any) takes over",
                      file=sys.stderr, flush=True)
            return None
        (step, nbytes), source = max(holders.items())
        fetched = fetch(step) if fetch is not None else None
        t2 = time.perf_counter()
        copy, data = held.get(step, (None, None)) if comm.rank == source else (None, None)
        meta = copy.meta if copy is not None else None
        with agreed(comm, f"warm resume: the model of step {step}", step=step, timeout=timeout):
            described = comm.broadcast_bytes(pickle.dumps(meta) if meta is not None else None, source, timeout)
            meta = pickle.loads(described)
            self._wait()
            words = self.memory.zeros(-(-nbytes // 4))
            incoming = words.view(np.uint8)
            if comm.rank == source:
                incoming[:nbytes] = data
            comm.broadcast(incoming[:nbytes], source, timeout)
        t3 = time.perf_counter()
        self._take(words, meta, step, comm)
        remove_earlier(self.memory, comm, launch, table)
        return {"step": step, "from_world_size": meta["world_size"], "fetched": fetched,
                "bytes_read": sum(d.nbytes for _, d in held.values()), "bytes_moved": nbytes * (comm.size - 1),
                "phases": {"list_s": t1 - t0, "agree_s": t2 - t1, "move_s": t3 - t2,
                           "finish_s": time.perf_counter() - t3}}

    def _take(self, words: np.ndarray, meta: dict, step: int, comm) -> None:
        """Makes the received copy (``words``: a new segment, or private memory) the model's and
        optimizer's state and marks it committed at ``step`` (its checksum is the source's)."""
        incoming = words.view(np.uint8)
        offset, length = meta["layout_offset"], meta["layout_nbytes"]
        described = pickle.loads(incoming[offset: offset + length].tobytes())
        self._drop()
        self._hold(words)
        self._layout_place, self._values = (offset, length), described["values"]
        self._views = _views(incoming, described["layout"])
        self._point(described["layout"])
        self.committed_step, self._written_at = step, (comm.world_rank, comm.size)
        self._seal(step, digest=meta["xxh3"])
