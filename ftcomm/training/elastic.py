"""The elastic driver: run training steps, and on a rank failure recover, re-shard and resume.

In the spirit of Horovod elastic (``hvd.elastic.run`` with State.commit / restore): the state
(model, ShardedOptimizer, sampler, RNG) is committed atomically at the end of every step by the
optimizer's agreement, and restored from memory (own shard + buddy replicas) after a failure.
The loop::

    step s:   batch = sampler's next global batch, split over the current ranks
              train_step(state, batch)            # forward + backward, local
              optimizer.step(...)                 # allreduce, shard update, allgather,
                                                  # replication, agree -> commit or raise
    failure:  comm.recover() (revoke + shrink)  -> optimizer.rebuild(comm) -> redo step s

Each recovery is logged as one JSON line, ``{"event": "recovered", ...}`` with the fields of
``ftcomm.RecoveryEvent`` (step, lost world ranks, sizes, detection / agree / recover / rebuild
seconds, bytes moved), each committed step as a ``commit`` line (ftcomm/training/events.py lists
the kinds; ``ftcomm-report`` draws and sums them up); rank 0 shows a tqdm bar (step, loss, world
size). If a shard and all its replicas are lost (StateLostError) the driver falls back to the
last disk checkpoint when ``checkpoint_dir`` is set, else re-raises.

Disk checkpoints (``checkpoint_dir``, ``checkpoint_every``): asynchronous, in
``torch.distributed.checkpoint`` format (``ftcomm/training/checkpoint/``): after every
``checkpoint_every``-th committed step (or at the Young/Daly interval with "auto") each rank copies
its part to host memory and a background thread writes it. A run started with a complete
checkpoint in ``checkpoint_dir`` resumes from the newest one, at whatever world size it has now
(``ftcomm-run --restarts`` relaunches a job that died).
"""
from __future__ import annotations

import base64
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from .. import settings
from ..core import fault
from ..core.events import RecoveryEvent
from ..core.outcome import retrying
from ..errors import CollectiveTimeoutError, FtError, ProcFailedError, RevokedError, StateLostError
from ..core import runtime
from . import checkpoint, warm_resume
from .checkpoint import sharded
from .events import EventLog


@dataclass
class Batch:
    """What ``train_step`` gets for one step.

    Attributes:
        indices: this rank's sample indices (int64 numpy array; may be empty).
        global_size: samples in the global batch (divide a summed loss by it).
        step: the training step being attempted (1-based; a redone step keeps its id).
        epoch: epoch of the batch.
    """

    indices: np.ndarray
    global_size: int
    step: int
    epoch: int


class State:
    """Everything that must survive a failure (Horovod elastic's State).

    Args:
        model: torch.nn.Module (its parameters are managed by ``optimizer``).
        optimizer: ftcomm.ShardedOptimizer.
        sampler: ftcomm.ElasticSampler.

    The committed metadata put in the replicas is the sampler position after the step and this
    rank's torch RNG state (base64 of torch.get_rng_state()).
    """

    def __init__(self, model, optimizer, sampler):
        self.model, self.optimizer, self.sampler = model, optimizer, sampler

    @property
    def comm(self):
        return self.optimizer.comm

    @property
    def step(self) -> int:
        """Last committed step."""
        return self.optimizer.step_id

    def next_batch(self) -> Batch:
        g = self.sampler.global_batch()
        return Batch(self.sampler.local_indices(self.comm.rank, self.comm.size), len(g),
                     self.step + 1, self.sampler.epoch)

    def capture(self, advanced: bool) -> dict:
        """Metadata to commit: sampler position (after the step when ``advanced``) and RNG."""
        position = self.sampler.position_after_step() if advanced else self.sampler.state_dict()
        rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
        return {"sampler": position, "rng": rng}

    def restore(self, meta: dict) -> None:
        """Back to the committed metadata (after a commit, an abort or a rebuild)."""
        if "sampler" in meta:
            self.sampler.load_state_dict(meta["sampler"])
        if "rng" in meta:
            raw = np.frombuffer(base64.b64decode(meta["rng"]), np.uint8).copy()
            torch.set_rng_state(torch.from_numpy(raw))


@dataclass
class Summary:
    """What ``run`` returns (the same on every surviving rank, except ``peak_rss_bytes``)."""

    steps: int = 0  # last committed step
    failures: int = 0  # recoveries performed
    redone_steps: int = 0  # step attempts that did not commit and were redone
    world_size: int = 0
    events: list = field(default_factory=list)
    losses: list = field(default_factory=list)  # (step, mean loss) of committed steps
    peak_rss_bytes: int = 0
    replica_bytes: int = 0


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@dataclass
class _Disk:
    """The run's disk tier: its directory, and the writer of its checkpoints (None: none written)."""

    directory: str
    writer: object = None


def _recover(state: State, error: FtError, log: EventLog, disk: _Disk | None, policy: str | None,
             max_attempts: int = 8) -> dict:
    """Recovers and rebuilds until a rebuild commits (a failure may hit the recovery itself: the
    old holdings stay intact until a rebuild commits, so it simply starts over). Returns the
    logged event (a ``RecoveryEvent`` as a dict, ``"event": "recovered"``)."""
    opt = state.optimizer
    detected, detected_time = time.perf_counter(), time.time()
    timing = getattr(opt, "timing", {})
    before = comm = opt.comm
    in_progress = opt.step_id + 1  # the step the failure interrupted (a disk fallback moves step_id back)
    recover_s, report = 0.0, None
    retry_on = (ProcFailedError, RevokedError, CollectiveTimeoutError)
    for attempt in retrying(max_attempts, retry_on=retry_on):
        with attempt:
            t0 = time.perf_counter()
            fault.point("shrink", comm.world_rank, opt.step_id + 1)
            comm = comm.recover(policy=policy)  # from the latest one, if a rebuild failed
            recover_s += time.perf_counter() - t0
            report = _rebuild_or_restore(state, comm, log, disk)
    state.restore(opt.committed_meta)
    event = comm.recovery or RecoveryEvent()
    event.lost_world_ranks = sorted(set(before.world_ranks) - set(comm.world_ranks))
    event.old_size, event.new_size = before.size, comm.size
    # After a rebuild from memory every survivor holds the same last committed step.
    event.step = opt.step_id + 1 if report.get("disk_restore") is None else in_progress
    event.where, event.error = opt.phase or "train_step", type(error).__name__
    # From the start of the phase that failed to the exception (the kill time is not known here).
    event.detection_s = detected - getattr(opt, "last_phase_start", detected)
    # A failure after the gradient allreduce surfaces locally and is then agreed on by the step's
    # agreement, which belongs to the repair. (Inside the allreduce the core agrees and shrinks
    # before it raises: that time is in detection_s.)
    event.agree_s = timing.get("agree", 0.0) if "failed" in timing else 0.0
    event.recover_s, event.rebuild_s = recover_s, report["rebuild_s"]
    event.bytes_moved, event.from_replica = int(report["bytes_moved"]), report.get("from_replica", [])
    event.newcomers, event.disk_restore = report.get("newcomers", []), report.get("disk_restore")
    event.time, event.detected_time = time.time(), detected_time
    return log(event="recovered", **event.as_dict())


def _rebuild_or_restore(state: State, comm, log: EventLog, disk: _Disk | None) -> dict:
    """The rebuild from memory, or, when a shard and all its replicas are lost, the disk
    checkpoint (``_disk_fallback``)."""
    opt = state.optimizer
    try:
        return opt.rebuild(comm)
    except StateLostError as lost:
        if set(comm.world_ranks) - set(opt.layout.world_ranks):
            raise  # a newcomer has nothing to restore a disk checkpoint into: fail uniformly
        return _disk_fallback(state, comm, lost, log, disk)


def _disk_fallback(state: State, comm, lost: StateLostError, log: EventLog, disk: _Disk | None) -> dict:
    """Restores the newest complete disk checkpoint every survivor can read after a
    StateLostError, or re-raises it if there is none."""
    opt = state.optimizer
    log(event="state_lost", step=opt.step_id, lost_shards=lost.lost_shards,
        failed_ranks=lost.failed_ranks, message=str(lost), fallback=disk is not None)
    if disk is None:
        raise lost
    if disk.writer is not None:
        disk.writer.wait_published()  # this rank may be renaming the newest one right now
    t0 = time.perf_counter()
    restored = sharded.resume(opt, state.model, comm, disk.directory, log)
    if restored is None:
        raise lost
    log(event="disk_restore", step=restored["step"], lost_step=lost.step, bytes_read=restored["bytes_read"])
    return {"bytes_moved": 0, "rebuild_s": time.perf_counter() - t0, "from_replica": [],
            "disk_restore": restored["step"]}


def _scrub(state: State, log: EventLog, disk: _Disk | None) -> None:
    """``check_state()`` of the state's optimizer after a committed step, logged. A copy that
    nothing intact can replace (``replicas=0``, or a shard and all its replicas corrupted) is a
    StateLostError on a healthy communicator: the disk checkpoint then, as after losing ranks,
    else it is raised."""
    opt = state.optimizer
    try:
        found = opt.check_state()
    except StateLostError as lost:
        _disk_fallback(state, opt.comm, lost, log, disk)
        state.restore(opt.committed_meta)
        return
    if found is not None:
        log.record(event="corruption", **found.as_dict())


def _as_stats(value) -> list:
    if value is None:
        return []
    if isinstance(value, (int, float, np.floating, np.integer)):
        return [float(value)]
    return [float(v) for v in value]


def run(train_step, state: State, *, epochs: int | None = None, steps: int | None = None,
        log_path: str | None = None, progress: bool = True, checkpoint_dir: str | None = None,
        checkpoint_every: int | str = 0, mtbf_s: float | None = None, on_commit=None, on_recover=None,
        max_recoveries: int = 16, policy: str | None = None, check_every: int = 0) -> Summary:
    """Trains until ``steps`` committed steps (or ``epochs`` epochs), surviving rank failures.

    Args:
        train_step: ``f(state, batch) -> loss_sum`` (a float or a sequence of floats, summed over
            ranks): forward and backward on ``batch.indices`` with the loss summed over the local
            samples and divided by ``batch.global_size``. Must not communicate.
        state: State.
        epochs / steps: when to stop (one of them).
        log_path: JSON-lines event log (``{rank}`` is replaced by the world rank).
        progress: tqdm bar on rank 0.
        checkpoint_dir: disk checkpoints (``torch.distributed.checkpoint`` format, one
            directory per checkpoint, the newest two kept). A run that starts with a complete
            checkpoint there resumes from the newest one, at its own world size (event
            "resumed"); a StateLostError falls back to it.
        checkpoint_every: a checkpoint after every M-th committed step, written in the
            background (the step waits only for a copy to host memory); "auto": at the
            Young/Daly interval for ``mtbf_s`` from measured costs (event "checkpoint_interval");
            0 (default): none written.
        mtbf_s: with ``checkpoint_every="auto"``: mean seconds between failures that end the
            whole job (default FTCOMM_MTBF).
        on_commit: ``f(state, step, stats)`` after each committed step (stats: summed values,
            the last one the global sample count).
        on_recover: ``f(state, event)`` after each recovery (event: the logged dict, a
            ``RecoveryEvent`` plus "event": "recovered"); on a promoted spare once, after it
            joined ("event": "joined"), so that a collective in it matches.
        max_recoveries: give up (re-raise) after this many recoveries.
        policy: recovery policy passed to ``Communicator.recover`` ("shrink", "spares" or
            "respawn"; default FTCOMM_RECOVERY_POLICY, else "spares" when the job has spare
            ranks (``ftcomm-run --spares S``: none is left idle while a rank fails), else
            "shrink"). With "spares" the world
            size stays as it was while spares last; a promoted spare runs this same function: its
            ShardedOptimizer joined the survivors' rebuild, and it starts at the interrupted step
            with the replaced rank's data position and RNG (event "joined").
        check_every: every M committed steps, scrub the sharded state for silent corruption at
            rest (``ShardedOptimizer.check_state``: each live shard and replica against its
            checksum; a bad copy is rebuilt from intact ones; event "corruption"; with
            ``replicas=0`` or every copy bad: the disk checkpoint, else StateLostError). 0
            (default): never.

    Returns:
        Summary.

    Raises:
        StateLostError: a shard and its replicas were lost and there is no disk checkpoint.
        FtError: more than ``max_recoveries`` failures, or a recovery that could not complete.
    """
    if check_every < 0:
        raise ValueError(f"elastic.run: check_every must be >= 0, not {check_every}")
    opt, sampler = state.optimizer, state.sampler
    if policy is None:
        policy = settings.recovery_policy(default="spares" if settings.spares() > 0 else "shrink")
    if policy != "shrink":
        fault.can_recover(f"recovery policy {policy!r}")
    total = steps if steps is not None else epochs * sampler.steps_per_epoch
    log = EventLog(log_path, opt.comm.world_rank, echo=opt.comm.rank == 0 and progress)
    summary, attempts = Summary(), {}
    if opt.join_report is not None:  # a promoted spare: the committed state came from the survivors
        state.restore(opt.committed_meta)
        joined = opt.comm.recovery or RecoveryEvent()
        joined.step, joined.where, joined.time = opt.step_id + 1, "join", time.time()  # the step it redoes
        joined.rebuild_s, joined.bytes_moved = opt.join_report["rebuild_s"], int(opt.join_report["bytes_moved"])
        summary.events.append(log(event="joined", new_rank=opt.comm.rank, **joined.as_dict()))
        if on_recover is not None:
            on_recover(state, summary.events[-1])
    else:
        opt.committed_meta = state.capture(advanced=False)  # step 0: the starting position and RNG
    resumed = None
    if opt.join_report is None:  # a relaunch: first the nodes' shared memory, then the disk
        resumed = _warm_resume(state, log, policy, summary)
    if resumed is None and checkpoint_dir and opt.join_report is None:
        resumed = _resume(state, checkpoint_dir, log)
    if resumed is None and opt.join_report is None and settings.restart_count() and opt.comm.rank == 0:
        print(f"ftcomm: relaunch {settings.restart_count()} found no state to resume from (neither in the nodes' "
              f"memory nor {'in ' + checkpoint_dir if checkpoint_dir else 'on disk: no checkpoint_dir'}): "
              "training starts over", file=sys.stderr, flush=True)
    log.record(event="start", step=opt.step_id, world_size=opt.comm.size, total_steps=total,
               policy=policy or "", replicas=getattr(opt, "replicas", None))
    waiting_first_commit = summary.events[-1] if summary.events else None
    ckpt = None
    if checkpoint_dir and checkpoint_every:
        ckpt = checkpoint.AsyncCheckpointer(checkpoint_dir, checkpoint_every, mtbf_s=mtbf_s, log=log,
                                            timeout=opt.timeout)
        if resumed is not None:
            ckpt.schedule.costs.load_s = resumed["load_s"]
    disk = _Disk(checkpoint_dir, ckpt) if checkpoint_dir else None

    def recovered(error: FtError) -> dict:
        """Recovers from ``error`` (or re-raises it past ``max_recoveries``); the event."""
        summary.failures += 1
        if summary.failures > max_recoveries:
            raise error
        summary.events.append(_recover(state, error, log, disk, policy))
        if on_recover is not None:
            on_recover(state, summary.events[-1])
        bar.set_postfix(world=opt.comm.size)
        return summary.events[-1]

    bar = tqdm(total=total, initial=opt.step_id, disable=not progress or opt.comm.rank != 0,
               desc="train", unit="step", dynamic_ncols=True)
    while opt.step_id < total:
        batch = state.next_batch()
        attempts[batch.step] = attempts.get(batch.step, 0) + 1
        try:
            stats = _as_stats(train_step(state, batch)) + [float(len(batch.indices))]
            summed = opt.step(stats=stats, meta=state.capture(advanced=True))
        except FtError as error:
            waiting_first_commit = recovered(error)
            continue
        state.restore(opt.committed_meta)
        log.record(event="commit", step=opt.step_id, world_size=opt.comm.size,
                   **{f"{k}_s": round(v, 6) for k, v in getattr(opt, "timing", {}).items()})
        loss = summed[0] if len(summed) > 1 else float("nan")
        summary.losses.append((opt.step_id, float(loss)))
        if waiting_first_commit is not None:
            summary.events.append(log(event="first_commit", step=opt.step_id, world_size=opt.comm.size))
            if ckpt is not None and waiting_first_commit.get("detected_time"):
                ckpt.schedule.note_warm_recovery(time.time() - waiting_first_commit["detected_time"])
            waiting_first_commit = None
        runtime.note_committed(opt.step_id)
        if ckpt is not None:
            try:
                ckpt.at_step(opt.comm, opt.step_id, lambda: _checkpoint_entries(state))
            except FtError as error:  # the step stays committed; the checkpoint in flight is abandoned
                waiting_first_commit = recovered(error)
        if on_commit is not None:
            on_commit(state, opt.step_id, summed)
        bar.update(opt.step_id - bar.n)
        bar.set_postfix(loss=f"{loss:.4f}", world=opt.comm.size)
        if check_every and opt.step_id % check_every == 0:
            try:
                _scrub(state, log, disk)
            except FtError as error:  # the step stays committed; the recovery rebuilds it
                waiting_first_commit = recovered(error)
    bar.close()
    if ckpt is not None:
        _finish_checkpoints(ckpt, opt.comm, log)
    summary.steps, summary.world_size = opt.step_id, opt.comm.size
    summary.redone_steps = sum(n - 1 for s, n in attempts.items() if s <= opt.step_id)
    summary.peak_rss_bytes, summary.replica_bytes = _peak_rss_bytes(), opt.store.nbytes
    log.record(event="end", steps=summary.steps, failures=summary.failures, redone_steps=summary.redone_steps,
               world_size=summary.world_size)
    return summary


def _checkpoint_entries(state: State) -> dict:
    """This rank's part of a checkpoint: its share of the model, its optimizer shard, its metadata."""
    opt = state.optimizer
    return {**sharded.model_entries(state.model.state_dict(), opt.comm.rank, opt.comm.size),
            **sharded.optimizer_entries(opt)}


def _finish_checkpoints(ckpt, comm, log: EventLog) -> None:
    """Completes the checkpoint in flight at the end of training (a failure now abandons it: the
    run is over, and the previous complete checkpoint stays)."""
    try:
        ckpt.finish(comm)
    except FtError as error:
        log(event="checkpoint_abandoned", step=ckpt.completed[-1] if ckpt.completed else 0, why=str(error))
    finally:
        ckpt.close()


def _warm_resume(state: State, log: EventLog, policy: str | None, summary: Summary,
                 max_attempts: int = 8) -> dict | None:
    """On a relaunch, loads the newest step the nodes' shared memory holds whole
    (``warm_resume.py``), if any; a failure during it is recovered from (the event is logged and
    counted) and the resume tried again on the smaller group. Logs "resumed" with
    ``"from": "memory"``."""
    opt = state.optimizer
    for attempt in range(max_attempts):
        t0 = time.perf_counter()
        try:
            loaded = warm_resume.resume(opt, opt.comm, log)
        except FtError as error:
            if attempt + 1 == max_attempts:
                raise
            summary.failures += 1
            summary.events.append(_recover(state, error, log, None, policy))
            continue
        if loaded is None:
            return None
        state.restore(opt.committed_meta)
        loaded["load_s"] = time.perf_counter() - t0
        warm_resume.report(log.record, loaded["step"], opt.comm, loaded)
        return loaded
    return None


def _resume(state: State, checkpoint_dir: str, log: EventLog) -> dict | None:
    """Loads the newest complete checkpoint every rank can read, if there is one: the optimizer
    then stands at its step, re-sharded over this job's ranks. Logs "resumed"."""
    opt = state.optimizer
    t0 = time.perf_counter()
    loaded = sharded.resume(opt, state.model, opt.comm, checkpoint_dir, log)
    if loaded is None:
        return None
    state.restore(opt.committed_meta)
    loaded["load_s"] = time.perf_counter() - t0
    log.record(event="resumed", step=loaded["step"], **{"from": "disk"}, path=loaded["path"], world_size=opt.comm.size,
               from_world_size=loaded["from_world_size"], bytes_read=loaded["bytes_read"],
               load_s=round(loaded["load_s"], 6))
    if opt.comm.rank == 0:
        print(f"ftcomm: resumed from {loaded['path']} (step {loaded['step']}, written by {loaded['from_world_size']} "
              f"ranks) at world size {opt.comm.size} in {loaded['load_s']:.2f} s", file=sys.stderr, flush=True)
    return loaded
