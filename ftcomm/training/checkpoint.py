"""Optional disk checkpoints of the sharded state: the fallback when a shard and all its replicas
are lost together (StateLostError). Not on the fast path: in-memory replicas are.

Layout on disk (one directory, shared by the ranks; on several nodes it must be a shared file
system)::

    DIR/step00000040/shard0.pt ... shard{N-1}.pt    torch.save of each rank's shard
    DIR/LATEST                                      JSON: the last complete checkpoint

LATEST is replaced (write to a temporary file, then rename) only after an agreement says every
rank's file is written, and the previous checkpoint is kept until then: a failure during a
checkpoint never leaves the job without a complete one.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import torch

from ..core.outcome import agreed
from ..errors import FtError, StateLostError
from . import rebuild
from .layout import ShardLayout, overlaps

LATEST = "LATEST"


def _step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step{step:08d}")


def save(opt, directory: str) -> dict:
    """Writes this rank's committed shard (torch.save) and, once every rank has, marks the
    checkpoint complete. Collective over ``opt.comm``.

    Returns:
        {"step", "bytes" (this rank's file), "seconds"}.

    Raises:
        ProcFailedError: a rank failed or could not write; LATEST still names the previous
            checkpoint.
    """
    t0, comm, step = time.perf_counter(), opt.comm, opt.step_id
    path = _step_dir(directory, step)
    with agreed(comm, f"disk checkpoint of step {step}", step=step, timeout=opt.timeout,
                catch=(OSError, FtError)):
        os.makedirs(path, exist_ok=True)
        torch.save({"numel": opt.layout.numel, "world_ranks": list(opt.layout.world_ranks),
                    "shard": comm.rank, "step": step, "slots": list(opt.stepper.slots),
                    "state": torch.from_numpy(opt.live), "meta": opt.committed_meta,
                    "scalars": opt.scalars},
                   os.path.join(path, f"shard{comm.rank}.pt"))
    if comm.rank == 0:
        _mark_latest(directory, step, opt.layout)
    nbytes = os.path.getsize(os.path.join(path, f"shard{comm.rank}.pt"))
    return {"step": step, "bytes": nbytes, "seconds": time.perf_counter() - t0}


def _mark_latest(directory: str, step: int, layout: ShardLayout) -> None:
    previous = latest(directory)
    tmp = os.path.join(directory, LATEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "dir": os.path.basename(_step_dir(directory, step)),
                   "numel": layout.numel, "world_ranks": list(layout.world_ranks)}, f)
    os.replace(tmp, os.path.join(directory, LATEST))
    # keep the new and the previous checkpoint; older ones go
    keep = {f"step{step:08d}"} | ({previous["dir"]} if previous else set())
    for name in os.listdir(directory):
        if name.startswith("step") and name not in keep:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def latest(directory: str | None) -> dict | None:
    """The LATEST record ({"step", "dir", "numel", "world_ranks"}) or None if there is none."""
    if not directory:
        return None
    try:
        with open(os.path.join(directory, LATEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def restore(opt, comm, directory: str) -> dict:
    """Loads the last complete checkpoint re-sharded over ``comm`` (each rank reads only the
    pieces of the files that overlap its new shard, memory-mapped), replicates and agrees.
    The optimizer then stands at the checkpoint's step; the caller redoes the steps after it.

    Returns:
        {"step", "bytes_read" (this rank), "meta"}.

    Raises:
        StateLostError: there is no complete checkpoint.
        ProcFailedError: a rank failed during the restore (retry after recover()).
    """
    record = latest(directory)
    if record is None:
        raise StateLostError(f"no disk checkpoint in {directory!r}", step=opt.step_id)
    old = ShardLayout(record["numel"], tuple(record["world_ranks"]))
    new = ShardLayout(old.numel, tuple(comm.world_ranks))
    live = np.zeros((len(opt.stepper.slots), new.shard_len), np.float32)
    meta, scalars, nbytes, ok = {}, None, 0, True

    def load(shard):
        return torch.load(os.path.join(directory, record["dir"], f"shard{shard}.pt"), mmap=True,
                          weights_only=True)

    try:
        # The data position is global: any file has it; our own file also has our RNG state.
        mine = old.world_ranks.index(comm.world_rank) if comm.world_rank in old.world_ranks else 0
        own = load(mine)
        meta, scalars = own["meta"], own["scalars"]
        for shard, lo, hi in overlaps(old, new.bounds(comm.rank)):
            piece = load(shard)["state"][:, lo - old.start(shard):hi - old.start(shard)].numpy()
            live[:, lo - new.start(comm.rank):hi - new.start(comm.rank)] = piece
            nbytes += piece.nbytes
    except (OSError, RuntimeError, KeyError):
        ok = False  # agreed on, with the rest of the restore, by rebuild.finish
    rebuild.finish(opt, comm, new, live, record["step"], meta, ok)
    opt.scalars = scalars
    return {"step": record["step"], "bytes_read": nbytes, "meta": meta}
