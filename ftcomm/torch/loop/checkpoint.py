"""Disk checkpoints of a ``resilient`` torch loop: what the loop's state is, as entries of a
``torch.distributed.checkpoint`` checkpoint, and how a starting job resumes from one.

One checkpoint is the state of one applied step (written asynchronously by
``ftcomm.training.checkpoint.AsyncCheckpointer``):

- ``model.<name>``: the module's ``state_dict()`` (DDP's wrapper removed), each tensor written
  whole by one rank (``sharded.owners``);
- the optimizer: a ``ZeroRedundancyOptimizer``'s shards as shards (``optim.<slot>``, each rank
  its own, re-sharded at load) with its scalars and its param groups' settings
  (``optim.param_groups``); any other optimizer (DDP's, the same on every rank) as its
  ``state_dict()``: ``optim.state.<param index>.<name>`` tensors shared out like the model's,
  the rest in ``optim.rest``;
- ``extra.<i>``: the ``state_dict()`` of each ``extra_state`` object (LR schedulers);
- ``rng.<world rank>``: each rank's torch CPU RNG state (and its CUDA ones, if CUDA is in use);
- ``loader``: the epoch, its sample plan (or the world size whose ``DistributedSampler`` split
  it) and how much of it the applied steps used, the step counters; ``torch.format``: kinds.

On resume every rank loads the whole model (and a DDP optimizer), its own new shard of a ZeRO
optimizer, the extra state, its RNG state (its world rank's, else the first saved one's), and
goes on with the rest of the epoch: with as many ranks as wrote the checkpoint, each rank reads
on exactly as it would have without the stop; with another number, the epoch's unused samples
are dealt again over the ranks (``resplit``), none used twice or skipped.
"""
from __future__ import annotations

import sys
import time

import torch

from ...errors import FtError, InvalidInputError
from ...training.checkpoint import AsyncCheckpointer, Blob
from ...training.checkpoint import sharded
from ...training.checkpoint.dcp_parts import read, read_metadata
from ...training.checkpoint.resume import load_newest
from ..group.models import unwrap
from ..zero.optimizer import ZeroRedundancyOptimizer

FORMAT = 1



def _kinds(optimizer, extra_state) -> list:
    return [type(optimizer).__name__, [sorted(k for k in g if k != "params") for g in optimizer.param_groups],
            [type(obj).__name__ for obj in extra_state]]


def rng_states() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _optimizer_entries(optimizer, rank: int, size: int) -> dict:
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        out = sharded.optimizer_entries(optimizer.sharded)
        if rank == 0:
            out["optim.param_groups"] = Blob(optimizer.hand_over_settings())
        return out
    sd = optimizer.state_dict()
    tensors, rest = {}, {"param_groups": sd["param_groups"], "state": {}}
    for index, entry in sd["state"].items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value
            else:
                rest["state"].setdefault(index, {})[name] = value
    out = sharded.model_entries(tensors, rank, size, prefix="optim")
    if rank == 0:
        out["optim.rest"] = Blob(rest)
    return out


def entries(pg, model, optimizer, extra_state, loader_state: dict) -> dict:
    """This rank's part of a checkpoint of the loop's state (see the module docstring)."""
    rank, size, world_rank = pg.comm.rank, pg.comm.size, pg.comm.world_rank
    out = sharded.model_entries(unwrap(model).state_dict(), rank, size)
    out.update(_optimizer_entries(optimizer, rank, size))
    out[f"rng.{world_rank}"] = Blob(rng_states())
    if rank == 0:
        out.update({f"extra.{i}": Blob(obj.state_dict()) for i, obj in enumerate(extra_state)})
        out["loader"] = Blob(loader_state)
        out["torch.format"] = Blob({"format": FORMAT, "kinds": _kinds(optimizer, extra_state),
                                    "world_ranks": list(pg.comm.world_ranks)})
    return out


def _read_torch_optimizer(path: str, index: dict) -> dict:
    """A DDP optimizer's whole ``state_dict()`` from the checkpoint."""
    rest = read(path, {}, objects=("optim.rest",))["optim.rest"]
    tensors = {name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
               for name, md in index.items() if name.startswith("optim.state.")}
    read(path, tensors)
    state = {k: dict(v) for k, v in rest["state"].items()}
    for name, value in tensors.items():
        _, _, param, slot = name.split(".", 3)
        key = int(param) if param.lstrip("-").isdigit() else param
        state.setdefault(key, {})[slot] = value
    return {"state": state, "param_groups": rest["param_groups"]}


def _read_local(path: str, pg, model, optimizer, extra_state) -> dict:
    """Everything this rank loads without communicating; the loaded pieces, not yet applied
    (but for the model, loaded in place)."""
    index = read_metadata(path).state_dict_metadata
    record = read(path, {}, objects=("torch.format",))["torch.format"]
    if record["kinds"] != _kinds(optimizer, extra_state):
        raise InvalidInputError(f"checkpoint {path} holds optimizer / extra state {record['kinds']}; this "
                                f"script has {_kinds(optimizer, extra_state)}")
    rng_rank = pg.comm.world_rank if f"rng.{pg.comm.world_rank}" in index else record["world_ranks"][0]
    names = ("loader", f"rng.{rng_rank}", *(f"extra.{i}" for i in range(len(extra_state))))
    loaded = {"objects": read(path, {}, objects=names), "rng": f"rng.{rng_rank}",
              "bytes": sharded.read_model(path, unwrap(model).state_dict())}
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        loaded["settings"] = read(path, {}, objects=("optim.param_groups",))["optim.param_groups"]
        loaded["shard"] = sharded.read_optimizer(optimizer.sharded, path, pg.comm)
    else:
        loaded["optimizer"] = _read_torch_optimizer(path, index)
    return loaded


def _apply(pg, optimizer, extra_state, loaded: dict, step: int) -> dict:
    """Makes what ``_read_local`` read current (collective with a ZeRO optimizer: its shards are
    replicated and agreed on); returns the loader state to go on from."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.load_checkpoint(loaded["shard"], loaded["settings"], step)
    else:
        optimizer.load_state_dict(loaded["optimizer"])
    objects = loaded["objects"]
    for i, obj in enumerate(extra_state):
        obj.load_state_dict(objects[f"extra.{i}"])
    set_rng_states(objects[loaded["rng"]])
    return {**objects["loader"], "bytes_read": loaded["bytes"] + (loaded["shard"]["bytes"] if "shard" in loaded else 0)}


def resume(pg, model, optimizer, extra_state, root: str, log=None) -> dict | None:
    """Loads the newest complete checkpoint under ``root`` that every rank can read into the loop's
    objects, on every rank of ``pg`` (collective; ``training.checkpoint.resume.load_newest``).
    Returns the loader state to go on from, plus "step", "path", "load_s" and "bytes_read"; None
    when there is no complete checkpoint.

    Raises:
        InvalidInputError: the checkpoint is of another model, optimizer or extra state (every rank).
        StateLostError: no complete checkpoint could be read on every rank.
        ProcFailedError etc.: a rank failed meanwhile (the model may be half loaded: start again).
    """
    t0 = time.perf_counter()
    found = load_newest(pg.comm, root, lambda path, step: _read_local(path, pg, model, optimizer, extra_state),
                        lambda path, step, loaded: _apply(pg, optimizer, extra_state, loaded, step), log, pg.timeout)
    if found is None:
        return None
    step, path, state = found
    return {**state, "step": step, "path": path, "load_s": time.perf_counter() - t0}


class LoopCheckpoints:
    """The disk tier of one ``resilient`` loop: resume at its start, a checkpoint after applied
    steps.

    Args:
        directory, every, mtbf_s: as ``resilient``'s ``checkpoint_dir``, ``checkpoint_every``,
            ``mtbf_s``.
        log: the loop's event log function.
    """

    def __init__(self, directory: str, every, mtbf_s: float | None, log):
        self.directory, self.log = directory, log
        self.writer = AsyncCheckpointer(directory, every, mtbf_s=mtbf_s, log=log) if every else None
        self._recoveries_seen = 0

    def resume(self, pg, model, optimizer, extra_state) -> dict | None:
        """The newest complete checkpoint every rank can read, loaded, or None (``resume``)."""
        state = resume(pg, model, optimizer, extra_state, self.directory, self.log)
        if state is None:
            return None
        if self.writer is not None:
            self.writer.schedule.costs.load_s = state["load_s"]
        self.log(event="resumed", step=state["step"], path=state["path"], world_size=pg.size(),
                 bytes_read=state["bytes_read"], load_s=round(state["load_s"], 6))
        if pg.rank() == 0:
            print(f"ftcomm: resumed from {state['path']} (step {state['step']}) at world size {pg.size()} in "
                  f"{state['load_s']:.2f} s", file=sys.stderr, flush=True)
        return state

    def at_step(self, pg, step: int, make_entries, recoveries: list) -> None:
        """After an applied step (collective while a write is in flight; see AsyncCheckpointer).
        ``recoveries``: the process's recoveries so far: the first step applied after one gives
        its in-memory MTTR, which "auto" logs with its choices."""
        if self.writer is None:
            return
        if len(recoveries) > self._recoveries_seen:
            self._recoveries_seen = len(recoveries)
            detected = recoveries[-1].detected_time
            if detected:
                self.writer.schedule.note_warm_recovery(time.time() - detected)
        self.writer.at_step(pg.comm, step, make_entries)

    def finish(self, pg, final: bool = True) -> None:
        """At the end of the loop: completes the write in flight and, with ``final``, writes the
        last applied step's (see AsyncCheckpointer.finish; a failure abandons it)."""
        if self.writer is None:
            return
        try:
            self.writer.finish(pg.comm, final)
        except FtError as error:
            self.log(event="checkpoint_abandoned", why=str(error))
