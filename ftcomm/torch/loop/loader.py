"""Redoing a DDP step that a rank failure interrupted: the one line a training loop adds.

    for x, y in ftcomm.torch.resilient(loader):     # was: for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

What happens when a rank dies during a step (say in a gradient bucket's allreduce in backward):

1. The ftcomm process group sees the failure on every survivor at the same collective (ftcomm's
   commit protocol), rebuilds its communicator over the survivors (``Communicator.recover()``), and
   runs that collective and every later one on the survivors. Nothing raises, so DDP's backward
   finishes normally; ``pg.size()`` / ``dist.get_world_size()`` now give the new world size.
2. The step is *poisoned*: some of its buckets were averaged with the dead rank, some without. When
   the user calls ``optimizer.step()``, a global optimizer pre-hook sets every gradient of that
   optimizer to None, so the step changes nothing (params, moments and step counts untouched).
3. At the next iteration, ``resilient`` re-splits the samples of this epoch that no applied step
   has used (the interrupted step's batches of every rank, the dead rank's not-yet-read batches and
   everyone's remaining ones) over the survivors, round-robin as ``DistributedSampler`` deals but
   without its padding (each rank runs the same number of steps; a last batch may hold one sample
   more than another rank's), points the sampler at the new rank and world size for later epochs,
   and goes on. The interrupted step is thus redone over the survivors, with gradients averaged
   over the new world size (DDP reads ``pg.size()`` at each backward), and no sample of the epoch
   is lost or used twice (the padding ``DistributedSampler`` added before the failure aside).
   torch's CPU RNG is rewound to where the voided step started, so the redone step draws the same
   random numbers (dropout masks).

With spare ranks a spare takes the dead rank's place instead and the survivors hand it their
state at the end of the voided step (``join.py``); the loop is then written with ``model=``,
``optimizer=`` and ``epochs()`` (``ResilientLoader``).

In DDP every rank holds the full parameters and optimizer state, so the survivors already have
everything: nothing is fetched from replicas. (ZeRO-sharded state is ``ftcomm.ShardedOptimizer``'s
business.) The process-wide step state this loop shares with the process groups and the
optimizer hook lives in ``step_state.py``.
"""
from __future__ import annotations

import sys
import weakref

import torch

from ... import settings
from ...core import runtime
from ...errors import FtError
from ...training import warm_resume
from ...training.events import EventLog
from ..checks.divergence import DivergenceGuard
from ..checks.grad_outliers import GradOutlierCheck, ddp_hook
from ..group import late_rank
from ..group.executor import EXECUTOR
from ..group.process_group import ftcomm_group
from ..group.step_state import STATE, end_step, install_hook, recoveries, unpoison
from . import join, resplit
from .checkpoint import LoopCheckpoints
from .checkpoint import entries as checkpoint_entries
from .warm import LoopMemory


class ResilientLoader:
    """Iterates ``loader`` like ``for batch in loader`` and redoes a step that a rank failure
    interrupted (see the module docstring).

    Args:
        loader: a ``torch.utils.data.DataLoader``. With a ``DistributedSampler`` and a
            ``batch_size`` the remaining samples are re-split over the survivors; with any other
            loader the interrupted batch is yielded again on each survivor and the dead rank's
            remaining samples of the epoch are not read.
        process_group: the ftcomm process group DDP uses; default the default group.
        model: the DDP model (or the plain module), optimizer: its optimizer, extra_state:
            further objects with ``state_dict()`` / ``load_state_dict()`` (an LR scheduler, a
            GradScaler). Needed with spare ranks (``ftcomm-run --spares``): a promoted spare gets
            their state from the survivors (``join.py``). Unused otherwise.
        check_every: every so many applied steps, fingerprint the model and optimizer state
            on every rank and compare (``divergence.py``): a rank whose state silently diverged
            is repaired from the majority, fenced if it diverges again within ``fence_window``
            applied steps; without a majority every rank raises ``SilentCorruptionError``.
            0 (default): never.
        grad_outliers: "log" or "redo": every gradient bucket's allreduce also carries the ranks'
            local gradient norms (a DDP comm hook on ``model``, which must then be the
            ``DistributedDataParallel`` module without a comm hook of its own); a rank whose norm is
            not finite or above ``outlier_ratio`` x the others' median (at least the recent typical
            norm) is reported
            (``ftcomm.corruptions()``, the log) and, with "redo", the step is voided and redone
            once (``grad_outliers.py``). None (default): off.
        outlier_ratio: see ``grad_outliers``; default 100.
        log_path: JSON-lines event log of the run, one file per rank (``{rank}`` is replaced by
            the world rank), in the elastic driver's format (ftcomm/training/events.py): "start",
            "commit" per applied step, "recovered" per recovery (its ``step`` is the training
            step the failure interrupted: the last applied one + 1), "first_commit", the
            checkpoints' events, and "end" when ``epochs()`` finishes. What ``ftcomm-report``
            reads. None (default): no log.
        checkpoint_dir: disk checkpoints of applied steps, in ``torch.distributed.checkpoint``
            format (``checkpoint.py``: the model, the optimizer (ZeRO shards as shards),
            ``extra_state``, the loader's position, RNG states); needs ``model``, ``optimizer``,
            a ``DistributedSampler`` and ``epochs()``. A run that starts with a complete
            checkpoint there resumes from the newest one at ``epochs()``, at its own world size.
            None (default): no disk tier.
        checkpoint_every: a checkpoint after every N-th applied step, written in the background
            (the step waits only for a copy to host memory); "auto": the Young/Daly interval for
            ``mtbf_s`` from measured costs; 0 (default): none written (resume only).
        mtbf_s: for ``checkpoint_every="auto"``: mean seconds between failures that end the whole
            job (default FTCOMM_MTBF).

    Attributes:
        steps_applied: steps whose optimizer update went through (on a promoted spare, counted
            from the start of the job).
        steps_redone: steps voided by a failure and redone.
        last_step_skipped: whether the previous iteration's update was voided.
        epoch: the epoch ``epochs()`` is at (None outside it).
        joined: True on a promoted spare once it has the survivors' state.
        resumed_from: the step of the disk checkpoint this run resumed from (``checkpoint_dir``),
            or None.

    Raises (when iterating):
        TypeError: the process group is not an ftcomm one.
        ValueError: with spare ranks, the loop cannot take a newcomer (no ``model`` or
            ``optimizer``, no ``DistributedSampler``, or not iterated through ``epochs()``);
            with ``checkpoint_dir``, the same; raised on every rank before the first batch.
    """

    def __init__(self, loader, process_group=None, *, model=None, optimizer=None, extra_state=(),
                 check_every: int = 0, fence_window: int = 1000, grad_outliers: str | None = None,
                 outlier_ratio: float = 100.0, log_path: str | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every: int | str = 0, mtbf_s: float | None = None):
        if check_every and model is None:
            raise ValueError("ftcomm.torch.resilient: check_every needs model= (and optimizer=) to fingerprint")
        self._divergence = DivergenceGuard(check_every, fence_window)
        self._outliers = None if grad_outliers is None else _watch_gradients(model, grad_outliers, outlier_ratio)
        self._log_path, self._log = log_path, None
        self._recoveries_logged = len(recoveries())  # those of earlier loops are not this run's
        self.loader = loader
        self._pg = process_group
        self.model, self.optimizer, self.extra_state = model, optimizer, list(extra_state)
        if self._outliers is not None:  # a promoted spare must judge as the survivors do
            self.extra_state.append(self._outliers)
        self.steps_applied = 0
        self.steps_redone = 0
        self.last_step_skipped = False
        self.epoch = None
        self.joined = False
        self.resumed_from = None
        self._in_epochs = False
        self._resume = None  # a newcomer's starting point (the hand-over), or a checkpoint's
        self._checkpoints = None
        if checkpoint_dir is not None:
            if model is None or optimizer is None:
                raise ValueError("ftcomm.torch.resilient: checkpoint_dir needs model= and optimizer= (what a "
                                 "checkpoint holds)")
            self._checkpoints = LoopCheckpoints(checkpoint_dir, checkpoint_every, mtbf_s,
                                                lambda **event: self._record(self._process_group(), **event))
        # The warm tier: a ZeroRedundancyOptimizer's shards, or a plain optimizer's whole state, in node memory
        self._memory = LoopMemory(model, optimizer, self.extra_state) if optimizer is not None else None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def step_skipped(self) -> bool:
        """Inside the loop body, after ``optimizer.step()``: True when this iteration's update was
        voided by a failure (its samples will be read again by the survivors)."""
        EXECUTOR.drain()
        return STATE.skipped

    def epochs(self, count: int):
        """``for epoch in loader.epochs(E): for batch in loader: ...`` in place of
        ``for epoch in range(E): sampler.set_epoch(epoch)``: yields the epoch numbers and sets the
        sampler's epoch. On a promoted spare it first joins the survivors (model, optimizer and
        RNG state, the epoch's unused samples) and starts at their epoch, in their step. Needed
        with spare ranks, since only the loop knows where the survivors are.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"epochs: count must be >= 0, not {count}")
        pg = self._process_group()
        first = 0
        if pg.joining:
            self._resume = self._hand_over(pg, None)
            first = self._resume["epoch"]
        else:
            self._resume = self._resume_from_memory(pg)  # a relaunch: the nodes' memory first
            if self._resume is None and self._checkpoints is not None:
                self._resume = self._checkpoints.resume(pg, self.model, self.optimizer, self.extra_state)
            if self._resume is None and settings.restart_count() and pg.rank() == 0:
                print(f"ftcomm: relaunch {settings.restart_count()} found no state to resume from (neither in the "
                      "nodes' memory nor in a checkpoint_dir): training starts over", file=sys.stderr, flush=True)
            if self._resume is not None:
                first, self.resumed_from = self._resume["epoch"], self._resume["steps_applied"]
                self.steps_applied, self.steps_redone = self._resume["steps_applied"], self._resume["steps_redone"]
        self._in_epochs = True
        try:
            for epoch in range(first, count):
                self.epoch = epoch
                set_epoch = getattr(getattr(self.loader, "sampler", None), "set_epoch", None)
                if set_epoch is not None:
                    set_epoch(epoch)
                yield epoch
            self.flush_checkpoints()
            self._record(pg, event="end", steps=self.steps_applied, redone_steps=self.steps_redone,
                         world_size=pg.size())
        finally:
            self._in_epochs = False
            self.epoch = None

    def _resume_from_memory(self, pg, max_attempts: int = 8) -> dict | None:
        """On a relaunch, the newest step the nodes' shared memory holds whole (``warm.py``), or
        None; a failure during it recovers the group and tries again. Logs "resumed"."""
        if self._memory is None or not self._memory.active:
            return None
        for attempt in range(max_attempts):
            comm = pg.comm
            try:
                state = self._memory.resume(pg, lambda **event: self._record(pg, **event))
                break
            except FtError as error:
                if attempt + 1 == max_attempts:
                    raise
                pg.recover_after(comm, "warm resume", error)
                if pg.comm is comm:  # nothing was recovered: the error is not a failure to go past
                    raise
                unpoison()
                self._record_recoveries(pg)
        if state is None:
            return None
        warm_resume.report(lambda **event: self._record(pg, **event), state["steps_applied"], pg.comm, state)
        return state

    def flush_checkpoints(self, final: bool = True) -> None:
        """Waits for the checkpoint being written (``checkpoint_dir``) and completes it, then, with
        ``final``, writes one of the last applied step unless one has it already: what a loop
        that stops before ``epochs()`` ends calls, on every rank, so that a rerun in the same
        directory resumes where this run ended. ``epochs()`` does it at its end. ``final=False``
        leaves the checkpoints as the schedule made them. Collective when a write is in flight or
        a last checkpoint is due; a failure abandons that checkpoint (logged), and the complete
        ones stay."""
        if self._checkpoints is not None:
            self._checkpoints.finish(self._process_group(), final)

    def _hand_over(self, pg, loader_state):
        state = join.hand_over(pg, self.model, self.optimizer, self.extra_state, loader_state)
        if loader_state is None:
            self.steps_applied, self.steps_redone = state["steps_applied"], state["steps_redone"]
            self.joined = True
            # the newcomer's row of ftcomm-report's timeline starts here: it redoes this step
            self._record(pg, event="joined", step=self.steps_applied + 1, world_size=pg.size(),
                         new_rank=pg.rank())
        return state

    def _process_group(self):
        return ftcomm_group(self._pg, "ftcomm.torch.resilient")

    def record(self, **event) -> None:
        """Appends an event of the caller's own to the run's log (``log_path``; nothing without
        one), e.g. ``record(event="kill", step=s)`` before a planned kill, which the recovery
        report then times the failure from."""
        self._record(self._process_group(), **event)

    def _record(self, pg, **event) -> None:
        """Appends one event to the run's log (``log_path``), if there is one; the first call
        writes the run's "start" first."""
        if self._log_path is None:
            return
        if self._log is None:
            self._log = EventLog(self._log_path, pg.comm.world_rank, echo=False)
            engine = getattr(self.optimizer, "sharded", None)  # a ZeroRedundancyOptimizer's: its k
            self._log.record(event="start", step=self.steps_applied, world_size=pg.size(), policy=pg.policy,
                             replicas=getattr(engine, "replicas", None))
        if event:
            self._log.record(**event)

    def _record_recoveries(self, pg) -> bool:
        """Names the recoveries of the step that just ended by the training step they interrupted
        (``ftcomm.torch.recoveries()``) and logs them; True if there were any."""
        events = recoveries()[self._recoveries_logged:]
        self._recoveries_logged += len(events)
        for e in events:
            e.step = self.steps_applied + 1  # the training step, not the collective's ledger id
            self._record(pg, event="recovered", **e.as_dict())
        return bool(events)

    def _record_outlier(self, pg) -> None:
        """Logs the step's gradient outlier verdict, if the optimizer pre-hook took one."""
        event = (self._outliers.verdict or (False, None))[1]
        if event is not None:
            self._record(pg, event="grad_outlier", step=event.step, ranks=event.ranks, checked=event.checked,
                         action=event.action)

    def _checkpoint(self, pg, loader_state: dict) -> None:
        """The disk tier after an applied step: a checkpoint due starts (staging only), one in
        flight is checked (an agreement). A failure in that agreement recovers the group as a
        failed collective would; the applied step stays applied, and the next one runs on the
        rebuilt group."""
        comm = pg.comm
        try:
            self._checkpoints.at_step(pg, self.steps_applied, lambda: checkpoint_entries(
                pg, self.model, self.optimizer, self.extra_state, loader_state), recoveries())
        except FtError as error:
            if not pg.recover_after(comm, "checkpoint", error):
                raise
            unpoison()  # no step was running: the next one runs on the rebuilt group as it is
            self._record_recoveries(pg)

    def _check_joinable(self, pg, can_resplit: bool) -> bool:
        """With spares, whether a newcomer could join this loop; else raise (every rank runs
        the same script, so every rank raises)."""
        if pg.policy != "spares":
            return False
        missing = [name for name, value in (("model", self.model), ("optimizer", self.optimizer))
                   if value is None]
        if not can_resplit:
            missing.append("a DataLoader with a DistributedSampler and a batch_size")
        if not self._in_epochs:
            missing.append("the epoch loop `for epoch in loader.epochs(E):`")
        if getattr(self.model, "static_graph", False):
            # A fresh static-graph DDP reduces its first iteration in one delayed pass, unlike the
            # survivors' trained one: a newcomer's buckets would not match theirs.
            missing.append("a DDP model without static_graph=True")
        if missing:
            raise ValueError(
                "ftcomm.torch.resilient with spare ranks (ftcomm-run --spares) needs "
                + ", ".join(missing)
                + ": a promoted spare takes the survivors' state and position from it. Write "
                "loader = ftcomm.torch.resilient(loader, model=ddp_model, optimizer=optimizer); "
                "for epoch in loader.epochs(E): for batch in loader: ... (docs/TORCH.md, Spares)")
        return True

    def _steps_over(self, plan) -> int:
        """Steps of a pass over ``plan`` (every rank runs as many), or, with None, over the
        sampler's own split (the loader's length)."""
        if plan is None:
            return len(self.loader)
        return resplit.steps_for(plan, self.loader.batch_size, drop_last=self.loader.drop_last)

    def _entries_read(self, plan, used: int) -> int:
        """How many entries of its list of ``plan`` (None: the sampler's own split) each rank has
        read after ``used`` applied steps: what a re-split, a hand-over, the warm tier and a
        checkpoint record as used."""
        longest = self.loader.sampler.num_samples if plan is None else max(len(lst) for lst in plan)
        return resplit.entries_read(used, self._steps_over(plan), self.loader.batch_size, longest)

    def _loader_over(self, plan, rank: int):
        """A DataLoader over this rank's part of ``plan``, in as many batches as every other rank
        runs (``resplit.batches``), with the original loader's settings."""
        from torch.utils.data import DataLoader

        src = self.loader
        kwargs = dict(batch_sampler=resplit.batches(plan[rank], src.batch_size, self._steps_over(plan),
                                                    drop_last=src.drop_last),
                      num_workers=src.num_workers, collate_fn=src.collate_fn, pin_memory=src.pin_memory,
                      timeout=src.timeout, worker_init_fn=src.worker_init_fn, generator=src.generator)
        if src.num_workers > 0:
            kwargs.update(multiprocessing_context=src.multiprocessing_context,
                          prefetch_factor=src.prefetch_factor)
        return DataLoader(src.dataset, **kwargs)

    def _carry_on(self, pg, plan, read: int):
        """Every rank's part of the rest of ``plan`` after each read ``read`` entries of its list,
        over the group as it is now, and this rank's iterator over its part. The sampler is pointed
        at the group's size and this rank, since later epochs read it. That covers a newcomer too:
        it built its sampler for the size it was promoted into, which a failure inside the
        hand-over may have shrunk since. Returns (the new plan, the iterator)."""
        sampler = self.loader.sampler
        plan = resplit.carry_on(plan, read, pg.size(), drop_last=sampler.drop_last)
        resplit.reconfigure_sampler(sampler, pg.rank(), pg.size())
        return plan, self._iter_keeping_rng(plan, pg.rank())

    def _iter_keeping_rng(self, plan, rank: int):
        """An iterator over this rank's part of ``plan`` that leaves torch's RNG as it was:
        ``iter(DataLoader)`` draws a seed from it, which the epoch's first iterator already did,
        so a run with a re-split draws the same random numbers as one without."""
        state = torch.get_rng_state()
        it = iter(self._loader_over(plan, rank))
        torch.set_rng_state(state)
        return it

    def __iter__(self):
        from torch.utils.data.distributed import DistributedSampler

        pg = self._process_group()
        sampler = getattr(self.loader, "sampler", None)
        can_resplit = isinstance(sampler, DistributedSampler) and self.loader.batch_size is not None
        joinable = self._check_joinable(pg, can_resplit)
        warm = self._memory is not None and self._memory.active and can_resplit and self._in_epochs
        if self._checkpoints is not None and not (can_resplit and self._in_epochs):
            raise ValueError("ftcomm.torch.resilient with checkpoint_dir needs a DataLoader with a DistributedSampler "
                             "and a batch_size, iterated as `for epoch in loader.epochs(E): for batch in loader:` "
                             "(a checkpoint records the epoch and how much of it was used)")
        resume, self._resume = self._resume, None
        if resume is None:
            plan = None      # None: the sampler's own split of its current epoch
            it = iter(self.loader)
        else:  # a newcomer's first pass, or a resumed run's: the remaining samples of this epoch
            saved = resume["plan"] or resplit.sampler_plan_at(sampler, resume["plan_size"])
            plan, it = self._carry_on(pg, saved, resume["used"])
        plan_size = pg.size()
        used = 0             # batches of the current plan whose step was applied
        generation = pg.generation
        redo = None
        install_hook()
        EXECUTOR.drain()
        self._record(pg)  # the run's start, before its first step
        waiting_first_commit = False
        with STATE.lock:
            STATE.guards += 1
            STATE.joinable += joinable
            STATE.poisoned = STATE.skipped = STATE.stepped = False
            STATE.outlier_check = self._outliers
        late_rank.loop_started()
        try:
            while True:
                if redo is not None:
                    batch, redo = redo, None
                else:
                    try:
                        batch = next(it)
                    except StopIteration:
                        return
                rng = torch.get_rng_state()  # what this step starts from; a voided step rewinds to it
                if self._outliers is not None:
                    self._outliers.start_step(self.steps_applied + 1)
                yield batch
                EXECUTOR.drain()
                if self._outliers is not None:
                    self._record_outlier(pg)
                skipped = end_step()
                self.last_step_skipped = skipped
                if pg.generation != generation:  # the recoveries' step is the training step, log or not
                    waiting_first_commit |= self._record_recoveries(pg)
                if skipped:
                    self.steps_redone += 1
                    torch.set_rng_state(rng)  # the redone step draws what the voided one drew (dropout)
                else:
                    self.steps_applied += 1
                    used += 1
                    self._record(pg, event="commit", step=self.steps_applied, world_size=pg.size())
                    if waiting_first_commit:
                        self._record(pg, event="first_commit", step=self.steps_applied, world_size=pg.size())
                        waiting_first_commit = False
                    self._divergence.after_step(pg, self.model, self.optimizer, self.steps_applied)
                    runtime.note_committed(self.steps_applied)
                    if warm or self._checkpoints is not None:  # both need a batch_size (checked above)
                        loader_state = {"epoch": self.epoch, "plan": plan, "plan_size": plan_size,
                                        "used": self._entries_read(plan, used), "steps_applied": self.steps_applied,
                                        "steps_redone": self.steps_redone}
                    if warm:
                        self._memory.at_step(loader_state, pg.comm)
                    if self._checkpoints is not None:
                        self._checkpoint(pg, loader_state)
                if pg.generation == generation:
                    if skipped:  # voided without a failure (a gradient outlier): the same batch again
                        redo = batch
                    continue
                if can_resplit:  # the world changed during this step
                    read = self._entries_read(plan, used)
                    if plan is None:
                        plan = resplit.sampler_plan(sampler, plan_size)
                    if pg.awaiting_join:
                        self._hand_over(pg, {"epoch": self.epoch, "plan": plan, "used": read,
                                             "steps_applied": self.steps_applied, "steps_redone": self.steps_redone})
                    plan, it = self._carry_on(pg, plan, read)
                    plan_size, used = pg.size(), 0
                elif skipped:
                    redo = batch
                generation = pg.generation
        finally:
            late_rank.loop_ended()
            with STATE.lock:
                STATE.guards -= 1
                STATE.joinable -= joinable
                if STATE.outlier_check is self._outliers:
                    STATE.outlier_check = None


def resilient(loader, process_group=None, *, model=None, optimizer=None, extra_state=(), check_every: int = 0,
              fence_window: int = 1000, grad_outliers: str | None = None, outlier_ratio: float = 100.0,
              log_path: str | None = None, checkpoint_dir: str | None = None, checkpoint_every: int | str = 0,
              mtbf_s: float | None = None) -> ResilientLoader:
    """``for batch in ftcomm.torch.resilient(loader):`` -- iterate a DataLoader so that a step
    interrupted by a rank failure is redone over the survivors. With spare ranks, pass ``model``
    and ``optimizer`` and loop over ``.epochs(E)``; ``check_every=M`` compares the ranks' state
    every M steps (silent corruption at rest); ``grad_outliers="log"|"redo"`` watches the ranks'
    gradient norms (silent corruption in backward); ``checkpoint_dir=D, checkpoint_every=N``
    writes asynchronous disk checkpoints and resumes from the newest. See ``ResilientLoader``."""
    return ResilientLoader(loader, process_group, model=model, optimizer=optimizer, extra_state=extra_state,
                           check_every=check_every, fence_window=fence_window, grad_outliers=grad_outliers,
                           outlier_ratio=outlier_ratio, log_path=log_path, checkpoint_dir=checkpoint_dir,
                           checkpoint_every=checkpoint_every, mtbf_s=mtbf_s)


# The check of each DDP model whose comm hook it is: DDP takes one hook per model, and a loop may
# build ``resilient(...)`` anew every epoch.
_CHECKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _watch_gradients(model, policy: str, ratio: float) -> GradOutlierCheck:
    """The gradient outlier check of the DDP ``model``: registered as its comm hook the first
    time, the same check (with its history) with the new settings after that.

    Raises:
        ValueError: a bad policy or ratio, ``model`` is not a ``DistributedDataParallel`` module,
            or it already has a comm hook of its own (DDP takes one).
    """
    from torch.nn.parallel import DistributedDataParallel

    fresh = GradOutlierCheck(policy, ratio)
    if not isinstance(model, DistributedDataParallel):
        raise ValueError("ftcomm.torch.resilient: grad_outliers needs model= the DistributedDataParallel module, "
                         f"not {type(model).__name__}")
    check = _CHECKS.get(model)
    if check is not None:
        check.policy, check.ratio = fresh.policy, fresh.ratio
        return check
    group = ftcomm_group(model.process_group, "ftcomm.torch.resilient(grad_outliers=...)")
    try:
        model.register_comm_hook(None, ddp_hook(fresh, group))
    except RuntimeError as exc:  # DDP allows one hook
        raise ValueError(f"ftcomm.torch.resilient: grad_outliers registers a DDP comm hook, and the model has one "
                         f"already ({exc})") from exc
    _CHECKS[model] = fresh
    return fresh
