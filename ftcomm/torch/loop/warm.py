"""Warm restart of a ``resilient`` torch loop with a ``ZeroRedundancyOptimizer``: a relaunched job
resumes from the committed state its nodes still hold in shared memory.

The optimizer's shards and replicas already live in node-local segments
(``training/node_memory.py``). What else a step's state is, the loop keeps beside them, one small
blob per rank and applied step (``NodeMemory.put_blob``, two segments taking turns): the loader's
position (epoch, sample plan, how much of it was used, step counters), this rank's RNG states,
the ``extra_state`` objects' state dicts (LR schedulers), the model's buffers (BatchNorm
statistics: not parameters, so not in the shards) and the param groups' settings. Its cost per
step is a pickle of those (kilobytes).

On a relaunch ``resume`` lists the blobs on each node, lets the optimizer pick the newest step
whose every shard is held somewhere and whose blob some rank holds
(``ZeroRedundancyOptimizer.resume_from_memory``), gives every rank that step's blob (its own
world rank's when its node has it, for its RNG; the rest from the lowest rank that has one, by
one broadcast), and applies it. With a plain torch optimizer (DDP: the same state on every rank)
``ModelMemory`` (``model_memory.py``) keeps the model and the optimizer's state in a segment in
place of the optimizer's shards, and resumes the same way.
"""
from __future__ import annotations

import pickle
import time

import torch

from ... import settings
from ...core.outcome import agreed
from ...training import node_memory
from ...training.warm_resume import allgather_json
from ..zero.optimizer import ZeroRedundancyOptimizer, group_settings, take_group_settings
from .checkpoint import rng_states, set_rng_states
from .model_memory import ModelMemory

BLOB = "torch-loop"


def _module(model):
    return getattr(model, "module", model)


def _kept_state(model, optimizer):
    """What keeps the loop's optimizer state in node memory: a ZeroRedundancyOptimizer's shards,
    or, for a plain torch optimizer, a ``ModelMemory``; None when node memory is off."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer if optimizer.node_memory is not None else None
    if model is None or not isinstance(optimizer, torch.optim.Optimizer):
        return None
    from mpi4py import MPI

    memory = node_memory.NodeMemory.for_rank(MPI.COMM_WORLD.Get_rank())
    return None if memory is None else ModelMemory(optimizer, memory)


class LoopMemory:
    """The warm tier of one ``resilient`` loop (None-like when nothing keeps its state in node
    memory: ``active`` False).

    Args:
        model, optimizer, extra_state: the loop's.
    """

    def __init__(self, model, optimizer, extra_state):
        self.model, self.optimizer, self.extra_state = model, optimizer, list(extra_state or [])
        self.kept = _kept_state(model, optimizer)
        self.memory = None if self.kept is None else self.kept.node_memory

    @property
    def active(self) -> bool:
        return self.memory is not None and self.model is not None

    def at_step(self, loader_state: dict, comm) -> None:
        """After an applied step, on every rank of ``comm`` (the group's communicator): a plain
        optimizer's state is committed in its segment, and this rank's blob of the committed step
        written (no communication)."""
        if not self.active:
            return
        if isinstance(self.kept, ModelMemory):
            self.kept.commit(loader_state["steps_applied"], comm.world_rank, comm.size)
        step = self.kept.committed_step
        state = {"loader": loader_state, "rng": rng_states(),
                 "extra": [obj.state_dict() for obj in self.extra_state],
                 "buffers": {name: b.detach().cpu() for name, b in _module(self.model).named_buffers()},
                 "settings": group_settings(self.optimizer)}
        self.memory.put_blob(BLOB, step, pickle.dumps(state))

    def resume(self, pg, log) -> dict | None:
        """On a relaunch (FTCOMM_RESTART > 0): the newest step held whole in the nodes' memory,
        made current on every rank of ``pg``; returns the loader state to go on from plus "step",
        "load_s", "bytes_read", "bytes_moved", "bytes_replicated", "from_world_size", "phases",
        or None (then the disk). Collective.

        Raises:
            ProcFailedError etc.: a rank failed; nothing changed.
        """
        launch = settings.restart_count()
        if not self.active or launch == 0:
            return None
        t0 = time.perf_counter()
        comm = pg.comm
        # every blob on this node, read and checked (a few kilobytes per rank and step)
        blobs = [(b, data) for b in node_memory.scan_blobs(self.memory.directory, launch, BLOB, self.memory.engine)
                 for data in [b.read()] if data is not None]
        with agreed(comm, "warm resume: listing the loop's state", timeout=pg.timeout):
            everywhere = allgather_json(comm, sorted({b.step for b, _ in blobs}), pg.timeout)
        eligible = {step for steps in everywhere for step in steps}
        fetch = lambda step: self._fetch(pg, blobs, step)  # noqa: E731
        if isinstance(self.kept, ModelMemory):
            found = self.kept.resume_from_memory(comm, log, eligible, fetch, timeout=pg.timeout)
        else:
            found = self.kept.resume_from_memory(comm, log, eligible=eligible, fetch=fetch)
        if found is None:
            return None
        own, shared = found["fetched"]
        self._apply(shared)
        set_rng_states((own or shared)["rng"])  # this rank's own stream when its node kept it
        return {**shared["loader"], "step": found["step"], "load_s": time.perf_counter() - t0,
                "bytes_replicated": found.get("bytes_replicated", 0),  # a plain optimizer keeps no replicas
                **{k: found[k] for k in ("bytes_read", "bytes_moved", "from_world_size", "phases")}}

    def _fetch(self, pg, blobs: list, step: int) -> tuple:
        """(this rank's own blob of ``step`` or None, the blob of the lowest rank holding one):
        one broadcast. Uniform: a failure raises on every rank."""
        comm = pg.comm
        here = {b.meta["world_rank"]: data for b, data in blobs if b.step == step}
        own_bytes = here.get(comm.world_rank)
        any_bytes = own_bytes or next(iter(here.values()), None)
        with agreed(comm, f"warm resume: the loop's state of step {step}", step=step, timeout=pg.timeout):
            mins, _ = comm.minmax([comm.rank if any_bytes else comm.size], timeout=pg.timeout)
            root = mins[0]
            if root == comm.size:
                raise FileNotFoundError(f"no rank could read the loop's state of step {step}")
            shared = comm.broadcast_bytes(any_bytes if comm.rank == root else None, root, timeout=pg.timeout)
        return (pickle.loads(own_bytes) if own_bytes else None), pickle.loads(shared)

    def _apply(self, state: dict) -> None:
        take_group_settings(self.optimizer, state["settings"])
        for obj, saved in zip(self.extra_state, state["extra"]):
            obj.load_state_dict(saved)
        buffers = dict(_module(self.model).named_buffers())
        for name, value in state["buffers"].items():
            if name in buffers:
                buffers[name].data.copy_(value)

