"""Catching a DDP rank whose replicated state silently diverged (a bit flipped in its memory):
``resilient(loader, model=, optimizer=, check_every=M)``.

Every M applied steps, between steps, each rank fingerprints its parameters, buffers and
optimizer state (``ftcomm.core.fingerprint``: XXH3-64, allgathered, majority vote). The policy:

* all equal: nothing happens (cost: one hash pass over the state and one small allgather);
* a strict majority agrees: the suspects take the majority's state (model and optimizer
  state_dicts broadcast from the lowest-numbered majority rank), logged as repaired;
* a rank that is a suspect again within ``fence_window`` applied steps of its last repair is
  fenced as faulty: it prints why and kills itself, and the survivors' next collective sees a
  failure like any other (the group shrinks, or a spare takes its place);
* no strict majority (two ranks, a split vote): nobody can tell the good copy, so every rank
  raises ``SilentCorruptionError`` (fall back to a checkpoint).

Every event goes to ``ftcomm.corruptions()`` and stderr. A ZeroRedundancyOptimizer's state is
sharded (not equal across ranks), so only the model is fingerprinted then; its shards and their
replicas are scrubbed against their own checksums instead (``ShardedOptimizer.check_state``,
``ftcomm/training/scrub.py``), and a bad copy is rebuilt from an intact one.
"""
from __future__ import annotations

import io

import torch

from ...core import fault
from ...core.events import CorruptionEvent, record_corruption
from ...core.fingerprint import compare, digest
from ...core.liveness import fence_self
from ...errors import FtError, SilentCorruptionError, StateLostError
from ..group.models import unwrap
from ..zero.optimizer import ZeroRedundancyOptimizer

CHECKED = "parameter fingerprints"


def _host(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (t if t.device.type == "cpu" else t.cpu()).contiguous()


def state_tensors(model, optimizer) -> list:
    """The tensors that DDP keeps equal on every rank: the model's state_dict (parameters and
    buffers) and the optimizer's per-parameter state (not a sharded optimizer's), on the host."""
    out = [_host(t) for t in unwrap(model).state_dict().values() if isinstance(t, torch.Tensor)]
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        for state in optimizer.state.values():
            out += [_host(v) for v in state.values() if isinstance(v, torch.Tensor)]
    return out


class DivergenceGuard:
    """The check and its policy (module docstring). ``check_every``: applied steps between
    checks (0: never); ``fence_window``: applied steps within which a second divergence of the
    same rank fences it."""

    def __init__(self, check_every: int = 0, fence_window: int = 1000):
        if check_every < 0 or fence_window < 0:
            raise ValueError(f"check_every and fence_window must be >= 0, not {check_every} and {fence_window}")
        self.check_every, self.fence_window = check_every, fence_window
        self._last_repair: dict[int, int] = {}  # world rank -> applied step of its last repair

    def after_step(self, pg, model, optimizer, step: int) -> None:
        """Runs the check after applied step ``step`` when it is due (every rank calls it at
        the same step). A failure during the check is left to the next collective.

        Raises:
            SilentCorruptionError: the state diverged and no strict majority agrees.
        """
        if not self.check_every or step % self.check_every:
            return
        comm = pg.comm
        if isinstance(optimizer, ZeroRedundancyOptimizer) and optimizer.sharded is not None:
            try:
                optimizer.sharded.check_state()
            except StateLostError:
                raise
            except FtError:
                return
        first = next(iter(unwrap(model).parameters()), None)
        if first is not None and first.device.type == "cpu":  # tests: a flip in this rank's memory
            fault.flip("params", comm.world_rank, step, first.data)
        try:
            found = compare(comm, digest(state_tensors(model, optimizer)), timeout=pg.timeout)
        except FtError:
            return
        if found is None:
            return
        if found.ambiguous:
            record_corruption(CorruptionEvent(step, found.world_ranks, "DDP state", CHECKED, "raised: no majority"))
            raise SilentCorruptionError(
                f"ftcomm.torch: DDP state diverged across ranks after step {step} with no majority to trust "
                f"(digests by rank: {found.digests}); restore from a checkpoint", ranks=found.world_ranks, step=step,
                checked=CHECKED)
        repeat = [r for r in found.suspects if step - self._last_repair.get(r, -10**12) <= self.fence_window]
        if repeat:
            record_corruption(CorruptionEvent(step, found.suspects, "DDP state", CHECKED,
                                              f"fenced world ranks {repeat} (diverged again within {self.fence_window} steps)"))
            if comm.world_rank in found.suspects:
                fence_self(comm.world_rank, "its DDP state diverged again")
            return
        root = found.majority[0]
        self._repair(comm, model, optimizer, root, pg.timeout, comm.world_rank in found.suspects)
        for r in found.suspects:
            self._last_repair[r] = step
        record_corruption(CorruptionEvent(step, found.suspects, "DDP state", CHECKED,
                                          f"repaired from world rank {comm.world_ranks[root]}"))

    @staticmethod
    def _repair(comm, model, optimizer, root: int, timeout, suspect: bool) -> None:
        payload = None
        if comm.rank == root:
            buf = io.BytesIO()
            opt_state = optimizer.state_dict() if optimizer is not None and not isinstance(
                optimizer, ZeroRedundancyOptimizer) else None
            torch.save({"model": unwrap(model).state_dict(), "optimizer": opt_state}, buf)
            payload = buf.getvalue()
        payload = comm.broadcast_bytes(payload, root, timeout=timeout)
        if not suspect:
            return
        # weights_only=False: the payload comes from this job's own ranks, not from a file.
        blob = torch.load(io.BytesIO(payload), weights_only=False, map_location="cpu")
        with torch.no_grad():
            unwrap(model).load_state_dict(blob["model"], strict=True)
        if blob["optimizer"] is not None:
            optimizer.load_state_dict(blob["optimizer"])
