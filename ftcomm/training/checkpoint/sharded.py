"""What a checkpoint holds of a model and a ``ShardedOptimizer``, and how it is loaded back at any
world size.

Names in the checkpoint (DCP's flat names, so ``torch.distributed.checkpoint.load`` of
``{"model": module.state_dict()}`` finds the weights):

- ``model.<name>``: every tensor of ``module.state_dict()``, each written whole by one rank
  (``owners``: the largest first, each to the rank with the fewest bytes so far), so that every
  rank writes about 1/N of the model;
- ``optim.<slot>`` (``exp_avg``, ``exp_avg_sq``, ...): the optimizer state over the flat
  parameter vector (the ZeRO layout of ``training/layout.py``), each rank writing its shard as a
  chunk at its offset; any world size reads back the range of its own new shard (re-sharding);
- ``optim.scalars`` (per param group: step counts), ``optim.format`` (element count, optimizer
  class, slots, world ranks), ``meta.<world rank>`` (each rank's committed metadata: the data
  position, its RNG state).

The parameters' optimizer copy (slot "param") is not written: it is the model's parameters.
"""
from __future__ import annotations

import time

import torch

from ...core.outcome import agreed
from ...errors import FtError, InvalidInputError, StateLostError
from ..layout import ShardLayout
from . import directory
from .dcp_parts import Blob, Piece, Whole, join_parts, read, read_metadata, write_part
from .resume import load_newest

FORMAT = 1


def owners(sizes: dict, ranks: int) -> dict:
    """{name: rank that writes it} for tensors of ``sizes`` ({name: bytes}): the largest first,
    each to the rank with the fewest bytes so far (ties: the lower rank). The same on every rank."""
    load = [0] * ranks
    out = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        out[name] = rank
        load[rank] += sizes[name]
    return out


def model_entries(state_dict: dict, rank: int, ranks: int, prefix: str = "model") -> dict:
    """This rank's share of a model's ``state_dict()``: the tensors ``owners`` gives it, whole."""
    tensors = {k: v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    mine = owners({k: v.numel() * v.element_size() for k, v in tensors.items()}, ranks)
    return {f"{prefix}.{k}": Whole(v.detach()) for k, v in tensors.items() if mine[k] == rank}


def optimizer_entries(opt, prefix: str = "optim") -> dict:
    """This rank's share of a ``ShardedOptimizer``'s committed state: its shard of every state
    slot, and (rank 0) the scalars and the format record."""
    comm, layout = opt.comm, opt.layout
    lo, hi = layout.bounds(comm.rank)
    out = {}
    if hi > lo:
        for i, slot in enumerate(opt.stepper.slots[1:], start=1):
            out[f"{prefix}.{slot}"] = Piece(torch.from_numpy(opt.live[i, : hi - lo]), lo, layout.numel)
    if comm.rank == 0:
        out[f"{prefix}.scalars"] = Blob(opt.scalars)
        out[f"{prefix}.format"] = Blob({"format": FORMAT, "numel": layout.numel, "optimizer": opt.stepper.name,
                                        "slots": list(opt.stepper.slots[1:]), "world_ranks": list(layout.world_ranks)})
    out[f"meta.{comm.world_rank}"] = Blob(opt.committed_meta)
    return out


def _check_format(record: dict, opt, path: str) -> None:
    theirs = (record["numel"], record["optimizer"], record["slots"])
    ours = (opt.numel, opt.stepper.name, list(opt.stepper.slots[1:]))
    if theirs != ours:
        raise InvalidInputError(f"checkpoint {path} holds {theirs[0]} parameters for {theirs[1]} (slots {theirs[2]}); "
                                f"this optimizer has {ours[0]} for {ours[1]} (slots {ours[2]})")


def read_optimizer(opt, path: str, comm, prefix: str = "optim") -> dict:
    """This rank's part of the checkpoint in ``path`` for ``opt``'s layout over ``comm``: {"slots":
    {slot: float32 array of its shard's real elements}, "scalars", "meta" (the committed
    metadata its own world rank saved, else that of the first rank that saved), "format",
    "bytes"}. No collective.

    Raises:
        InvalidInputError: the checkpoint is of another model or optimizer.
        OSError, RuntimeError: a file is missing or unreadable.
    """
    index = read_metadata(path).state_dict_metadata
    record = read(path, {}, objects=(f"{prefix}.format",))[f"{prefix}.format"]
    _check_format(record, opt, path)
    saved = record["world_ranks"]
    meta_rank = comm.world_rank if f"meta.{comm.world_rank}" in index else saved[0]
    lo, hi = ShardLayout(opt.numel, tuple(comm.world_ranks)).bounds(comm.rank)
    slots = {s: torch.zeros(hi - lo) for s in opt.stepper.slots[1:]}
    names = {f"{prefix}.{s}": t for s, t in slots.items() if hi > lo}
    objects = read(path, names, {n: (lo, hi) for n in names}, (f"{prefix}.scalars", f"meta.{meta_rank}"))
    return {"slots": {s: t.numpy() for s, t in slots.items()}, "scalars": objects[f"{prefix}.scalars"],
            "meta": objects[f"meta.{meta_rank}"] or {}, "format": record,
            "bytes": sum(t.numel() * 4 for t in slots.values())}


def check_model(index: dict, state_dict: dict, path: str, prefix: str = "model") -> None:
    """Whether the checkpoint (its ``state_dict_metadata``) holds every tensor of a model's
    ``state_dict()`` with the same shape and dtype.

    Raises:
        InvalidInputError: naming the first few that differ (a checkpoint of another model).
    """
    wrong = []
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        saved = index.get(f"{prefix}.{name}")
        if saved is None:
            wrong.append(f"{name} missing")
        elif tuple(saved.size) != tuple(tensor.shape) or saved.properties.dtype != tensor.dtype:
            wrong.append(f"{name} {saved.properties.dtype} {tuple(saved.size)} there, "
                         f"{tensor.dtype} {tuple(tensor.shape)} here")
    if wrong:
        raise InvalidInputError(f"checkpoint {path} is of another model: {'; '.join(wrong[:4])}"
                                + (f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""))


def read_model(path: str, state_dict: dict, prefix: str = "model") -> int:
    """Loads every tensor of a model's ``state_dict()`` from ``path`` in place (every rank reads
    the whole model), after checking that the checkpoint is of this model. Returns the bytes
    read.

    Raises:
        InvalidInputError: the checkpoint is of another model.
        CheckpointIOError: a file is missing or damaged.
    """
    check_model(read_metadata(path).state_dict_metadata, state_dict, path, prefix)
    tensors = {f"{prefix}.{k}": v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        read(path, tensors)
    return sum(v.numel() * v.element_size() for v in tensors.values())


def resume(opt, model, comm, root: str, log=None) -> dict | None:
    """Loads the newest complete checkpoint under ``root`` that every rank can read
    (``resume.load_newest``) into ``model`` (every rank: the whole model) and ``opt`` (every
    rank: its shard of the layout over ``comm``, re-sharded from whatever world size wrote it),
    then replicates and agrees (``ShardedOptimizer.load_shard``). Collective over ``comm``: the
    optimizer's communicator, or the survivors' after a failure that lost a shard with all its
    replicas.

    Returns:
        {"step", "path", "bytes_read" (this rank), "meta" (this rank's committed metadata),
        "from_world_size"}, or None when there is no complete checkpoint.

    Raises:
        InvalidInputError: the checkpoint is of another model or optimizer (every rank).
        StateLostError: no complete checkpoint could be read on every rank.
        ProcFailedError etc.: a rank failed; the optimizer is as before.
    """
    def read_local(path, step):
        nbytes = read_model(path, model.state_dict())
        part = read_optimizer(opt, path, comm)
        return {**part, "bytes": part["bytes"] + nbytes}

    def apply(path, step, part):
        opt.load_shard(part["slots"], part["scalars"], step, part["meta"], comm=comm)
        return part

    found = load_newest(comm, root, read_local, apply, log, opt.timeout)
    if found is None:
        return None
    step, path, part = found
    return {"step": step, "path": path, "bytes_read": part["bytes"], "meta": part["meta"],
            "from_world_size": len(part["format"]["world_ranks"])}


def save(opt, model, root: str) -> dict:
    """A synchronous checkpoint of the committed step of ``opt`` and ``model`` under ``root``
    (the training waits for the disk; ``AsyncCheckpointer`` is the way that does not). Collective.

    Returns:
        {"step", "bytes" (this rank's part), "seconds"}.

    Raises:
        ProcFailedError: a rank failed or could not write; the complete checkpoints are as before.
    """
    t0, comm, step = time.perf_counter(), opt.comm, opt.step_id
    temporary = directory.temporary_dir(root, step, f"sync-{comm.size}")
    nbytes = 0
    with agreed(comm, f"disk checkpoint of step {step}", step=step, timeout=opt.timeout, catch=(OSError, FtError)):
        nbytes = write_part(temporary, comm.rank, {**model_entries(model.state_dict(), comm.rank, comm.size),
                                                  **optimizer_entries(opt)})
    if comm.rank == 0:
        join_parts(temporary, comm.size)
        directory.publish(root, temporary, step)
        directory.prune(root, keep=2, older_than=step)
    return {"step": step, "bytes": nbytes, "seconds": time.perf_counter() - t0}


def restore_latest(opt, model, comm, root: str) -> dict:
    """``resume``, for a caller that needs a checkpoint.

    Raises:
        StateLostError: there is no complete checkpoint that every rank can read.
        As ``resume``.
    """
    found = resume(opt, model, comm, root)
    if found is None:
        raise StateLostError(f"no complete checkpoint in {root!r}", step=opt.step_id)
    return found
