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

import numpy as np
import torch

from ...core.outcome import agreed
from ...errors import FtError, InvalidInputError, StateLostError
from ..layout import ShardLayout
from . import directory
from .dcp_parts import Blob, Piece, Whole, join_parts, read, read_metadata, write_part
from .resume import agreed_latest

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


def read_model(path: str, state_dict: dict, prefix: str = "model") -> int:
    """Loads every tensor of a model's ``state_dict()`` from ``path`` in place (every rank reads
    the whole model). Returns the bytes read."""
    tensors = {f"{prefix}.{k}": v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        read(path, tensors)
    return sum(v.numel() * v.element_size() for v in tensors.values())


def restore(opt, model, comm, path: str, step: int) -> dict:
    """Loads the checkpoint in ``path`` (of committed ``step``) into ``model`` (every rank: the
    whole model) and ``opt`` (every rank: its shard of the layout over ``comm``, re-sharded from
    whatever world size wrote it), then replicates and agrees (``ShardedOptimizer.load_shard``).
    Collective over ``comm``: the optimizer's communicator, or the survivors' one after a
    failure that lost a shard with all its replicas.

    Returns:
        {"step", "bytes_read" (this rank), "meta" (this rank's committed metadata),
        "from_world_size"}.

    Raises:
        InvalidInputError: the checkpoint is of another model or optimizer (every rank).
        ProcFailedError: a rank could not read its part, or failed; nothing changed.
    """
    part, error, nbytes = None, None, 0
    try:
        nbytes = read_model(path, model.state_dict())
        part = read_optimizer(opt, path, comm)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:  # InvalidInputError is a ValueError
        error = exc
    empty = {s: np.zeros(0, np.float32) for s in opt.stepper.slots[1:]}
    try:
        opt.load_shard(part["slots"] if part else empty, part["scalars"] if part else None, step,
                       part["meta"] if part else {}, ok=part is not None, comm=comm)
    except FtError:
        if isinstance(error, InvalidInputError):
            raise error from None  # every rank read the same record and found the same mismatch
        raise
    return {"step": step, "bytes_read": nbytes + part["bytes"], "meta": part["meta"],
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
    """``restore`` of the newest complete checkpoint under ``root`` (the one every rank sees).

    Raises:
        StateLostError: there is no complete checkpoint.
        As ``restore``.
    """
    found = agreed_latest(comm, root, opt.timeout)
    if found is None:
        raise StateLostError(f"no complete checkpoint in {root!r}", step=opt.step_id)
    return restore(opt, model, comm, found[1], found[0])
