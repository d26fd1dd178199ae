"""The hand-over that brings a promoted spare into a running DDP job (``ftcomm-run --spares S``).

When a rank dies inside a resilient step and a spare takes its place (``ProcessGroupFtcomm``,
policy "spares"), the newcomer starts the training script where the spare was waiting (inside
``import ftcomm.torch``), builds its model, DDP wrapper and optimizer like any rank, and reaches
``ResilientLoader.epochs()``; the survivors finish the voided step among themselves and reach the
end of that step. Both then run ``hand_over``, one collective over the group's communicator:

1. allgather of one flag per rank: 1 = holds the training state (a survivor), 0 = newcomer;
2. the lowest rank holding state broadcasts (length, then bytes) one ``torch.save`` payload: the
   module's ``state_dict``, the optimizer's, those of ``extra_state`` objects (an LR scheduler, a
   GradScaler), torch's CPU RNG state, and the loader's position (epoch, the epoch's sample plan
   and how much of it was used, step counters); newcomers check that their optimizer and extra
   objects are of the same kinds and load it (``load_state_dict``, strict);
3. every rank rebuilds DDP's gradient buckets in one collective way (``_sync_ddp_buckets``), since a
   fresh DDP and one that trained for a while group gradients differently;
4. an agreement on whether every newcomer could load the state: if one could not (its script
   built another model), every rank raises. A failure anywhere in 1-4 makes the group recover
   (spares first, then shrink) and every rank start the hand-over again.

In DDP every rank holds the full parameters and optimizer state, so one copy is enough. A
``ZeroRedundancyOptimizer`` is the exception: the payload carries only its groups' settings, and
after step 2 every rank rebuilds its shards over the group (``hand_over_shards``): the newcomer
takes its shard from the buddy that kept the replaced rank's replica, and the parameters from the
shards' owners (which also undoes a half-applied voided step on the survivors).
"""
from __future__ import annotations

import io
import logging
import time

import numpy as np
import torch

from ... import settings
from ...core import fault
from ...errors import (CollectiveTimeoutError, FtError, InvalidInputError, ProcFailedError, RevokedError,
                      StateLostError)
from ..group.models import unwrap
from ..group.step_state import note_handover
from ..zero.optimizer import ZeroRedundancyOptimizer

log = logging.getLogger("ftcomm.recovery")


def hand_over(pg, model, optimizer, extra_state=(), loader_state: dict | None = None) -> dict:
    """Collective over the group (survivors and newcomers). Survivors pass their ``loader_state``;
    newcomers pass None and get the survivors' one. Returns the loader state every rank goes on
    from.

    Raises:
        InvalidInputError: a newcomer's model, optimizer or extra state does not accept the
            survivors' state dicts (different architecture or settings), on every rank.
        StateLostError: no rank holding the training state is left.
        CollectiveTimeoutError: a newcomer did not arrive within FTCOMM_JOIN_TIMEOUT, and could
            not be fenced (another host, or FTCOMM_LATE_RANK=raise).
    """
    # A newcomer still in its set-up when this deadline passes is late: the survivors fence it
    # (FTCOMM_LATE_RANK=fence) and go on, replacing it or shrinking. Only where fencing cannot
    # reach it does the deadline end the hand-over with an error.
    timeout = settings.join_timeout()
    t0 = time.perf_counter()
    while True:
        comm = pg.begin_handshake()
        try:
            state, loaded = _exchange(comm, model, optimizer, extra_state, loader_state, timeout, pg.timeout)
            if isinstance(optimizer, ZeroRedundancyOptimizer):
                optimizer.hand_over_shards(comm)
            _sync_ddp_buckets(model)
            every_rank_loaded = comm.agree(1 if loaded else 0, timeout=pg.timeout)
        except (ProcFailedError, RevokedError) as exc:
            pg.recover_in_handshake(comm, exc)
            continue
        except CollectiveTimeoutError as exc:
            pg.end_handshake()
            raise CollectiveTimeoutError(
                f"ftcomm.torch: the hand-over to a promoted spare did not complete within {timeout:.0f} s: "
                "the newcomer did not reach loader.epochs() (FTCOMM_JOIN_TIMEOUT) and could not be "
                "fenced") from exc
        except FtError:  # bad state, state lost
            pg.end_handshake()
            raise
        except RuntimeError as exc:  # a failure surfacing through DDP's reducer (torch wraps it)
            if pg.comm is comm:
                pg.end_handshake()
                raise
            log.info("hand-over interrupted by a failure (%s); starting again", exc)
            continue
        pg.end_handshake()
        if not every_rank_loaded:
            raise InvalidInputError(
                "ftcomm.torch: a promoted spare could not load the survivors' model / optimizer state "
                "(its script built a different model or optimizer); see the newcomer's log")
        if loader_state is not None:
            note_handover(time.perf_counter() - t0)
        return state


def _exchange(comm, model, optimizer, extra_state, loader_state, arrival_timeout: float, timeout: float):
    """Steps 1-2. Returns (the loader state, whether this rank's state is usable). The allgather
    waits up to ``arrival_timeout`` (FTCOMM_JOIN_TIMEOUT) for newcomers still in their set-up;
    once every rank has arrived, the broadcast has the group's usual deadline: a newcomer that
    hangs after arriving is fenced like any hung rank."""
    holds = np.array([0 if loader_state is None else 1], np.int64)
    flags = np.empty(comm.size, np.int64)
    comm.allgather(holds, flags, timeout=arrival_timeout)  # waits for newcomers still starting
    fault.point("join", comm.world_rank, comm.last_committed_step)  # tests: a failure mid-hand-over
    if not flags.any():
        raise StateLostError("ftcomm.torch: every rank that held the training state failed; a "
                             "newcomer has nothing to start from")
    if flags.all():
        return loader_state, True  # the newcomers failed and were not replaced: nothing to send
    root = int(np.argmax(flags))
    payload = comm.broadcast_bytes(_pack(model, optimizer, extra_state, loader_state) if comm.rank == root
                                   else None, root, timeout=timeout)
    if loader_state is not None:
        return loader_state, True
    try:
        return _unpack(payload, model, optimizer, extra_state), True
    except (RuntimeError, ValueError, KeyError) as exc:
        log.error("promoted spare: cannot load the survivors' state: %s", exc)
        return None, False



def _pack(model, optimizer, extra_state, loader_state) -> bytes:
    """The payload, every tensor in host memory: the newcomer's ``load_state_dict`` copies them
    onto its own devices (which need not be the survivor's device indices)."""
    buf = io.BytesIO()
    torch.save(_on_host({"model": unwrap(model).state_dict(), "optimizer": _optimizer_state(optimizer),
                         "kinds": _kinds(optimizer, extra_state), "extra": [obj.state_dict() for obj in extra_state],
                         "rng": torch.get_rng_state(), "loader": loader_state}), buf)
    return buf.getvalue()


def _on_host(value):
    """``value`` (nested dicts, lists and tuples) with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_on_host(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    return value


def _optimizer_state(optimizer):
    """A sharded optimizer's state moves shard by shard (``hand_over_shards``): only its
    settings travel in the payload."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.hand_over_settings()
    return optimizer.state_dict()


def _kinds(optimizer, extra_state) -> list:
    """The optimizer's class and its parameter groups' settings names, and the extra state
    objects' classes: what must agree for a state dict to fit."""
    groups = [sorted(k for k in group if k != "params") for group in optimizer.param_groups]
    return [type(optimizer).__name__, groups, [type(obj).__name__ for obj in extra_state]]


def _unpack(payload: bytes, model, optimizer, extra_state) -> dict:
    # weights_only=False: the payload comes from this job's own survivors, not from a file.
    blob = torch.load(io.BytesIO(payload), weights_only=False, map_location="cpu")
    if blob["kinds"] != _kinds(optimizer, extra_state):
        # load_state_dict checks only the number and sizes of parameter groups: an SGD state
        # would load into AdamW and fail at its first step.
        raise ValueError(f"the survivors have optimizer / extra state {blob['kinds']}, this newcomer "
                         f"{_kinds(optimizer, extra_state)}")
    with torch.no_grad():
        unwrap(model).load_state_dict(blob["model"], strict=True)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.take_settings(blob["optimizer"])
    else:
        optimizer.load_state_dict(blob["optimizer"])
    for obj, sd in zip(extra_state, blob["extra"]):
        obj.load_state_dict(sd)
    torch.set_rng_state(blob["rng"])
    return blob["loader"]


def _sync_ddp_buckets(model) -> None:
    """Step 3. DDP's reducer groups gradients into buckets; after its first iteration every rank
    adopts rank 0's grouping (gradient-ready order, first bucket 1 MiB), while a fresh DDP starts
    with one grouping of its own. A newcomer's first backward would then reduce buckets of other
    shapes than the survivors'. So every rank resets its reducer and regroups now, the same way
    (parameter order, rank 0's grouping broadcast through this group: two broadcasts), and resets
    once more, so that after the next backward every rank regroups in gradient-ready order, as a
    fresh DDP does after its first iteration (two more broadcasts, in that forward): the order
    that lets the reduction of the last layers' gradients overlap the rest of backward."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return
    reducer = model.reducer
    reducer._reset_state()
    reducer._push_all_rebuilt_params()
    reducer._rebuild_buckets()
    reducer._reset_state()
    model._has_rebuilt_buckets = False
