"""The torch backend's process-wide step state: whether a ``resilient`` loop is running, whether
a failure has poisoned its current step, and the recoveries so far.

Process groups write it (``note_recovery``) when they rebuild their communicator; the
optimizer-step pre-hook reads it to void a poisoned step; ``ResilientLoader`` (``loader.py``)
reads and resets it at each step boundary. It imports nothing else of the backend, so every
other module of it can import this one.
"""
from __future__ import annotations

import threading

import torch.optim.optimizer as _optim

from ...core.events import RecoveryEvent
from .executor import EXECUTOR


class _StepState:
    def __init__(self):
        self.lock = threading.Lock()
        self.guards = 0            # resilient loops running
        self.poisoned = False      # a failure hit the current step
        self.skipped = False       # an optimizer step was voided in the current step
        self.events: list[RecoveryEvent] = []
        self.hook = None
        self.joinable = 0          # running resilient loops a promoted spare can join
        self.outlier_check = None  # the running loop's gradient outlier check (grad_outliers.py)
        self.stepped = False       # the current step's optimizer step has begun (its pre-hook ran)
        self.pending_commits = []  # the step agreements of groups with uncommitted work (step_commit.py)


STATE = _StepState()


def recoveries() -> list[RecoveryEvent]:
    """Every recovery of an ftcomm process group in this process so far, oldest first
    (``ftcomm.RecoveryEvent``: ``lost_world_ranks``, ``old_size``, ``new_size``, ``where`` (the
    collective that saw the failure), ``step``, ``recover_s``, ``policy``, ``promoted``,
    ``handover_s``, ``in_resilient_step``)."""
    with STATE.lock:
        return list(STATE.events)


def note_recovery(event: RecoveryEvent, redo: bool = True) -> bool:
    """Called by a process group after it rebuilt its communicator. Returns True when a resilient
    step is running (the step is then poisoned and will be redone), False otherwise (the failed
    collective then raises). ``redo=False``: record only (a failure during a join hand-over)."""
    with STATE.lock:
        event.in_resilient_step = redo and STATE.guards > 0
        STATE.events.append(event)
        if event.in_resilient_step:
            STATE.poisoned = True
        return event.in_resilient_step


def note_handover(seconds: float) -> None:
    """``join.py``, on a survivor: the hand-over after the latest recovery took ``seconds``."""
    with STATE.lock:
        if STATE.events:
            STATE.events[-1].handover_s = seconds


def in_resilient_step() -> bool:
    """True while a ``resilient`` loop runs (a failure then voids the step instead of raising)."""
    with STATE.lock:
        return STATE.guards > 0


def step_voided() -> bool:
    """True when a failure has voided the current resilient step."""
    with STATE.lock:
        return STATE.guards > 0 and STATE.poisoned


def void_current_step() -> None:
    """Marks the current step voided (``ZeroRedundancyOptimizer`` after a failure in its own
    step): ``resilient`` redoes it, as after a failure in backward."""
    with STATE.lock:
        STATE.poisoned = STATE.skipped = True


def unpoison() -> None:
    """A recovery between steps (the loop's checkpoint agreement failed) poisoned no step: the
    next one runs on the rebuilt group as any step does."""
    with STATE.lock:
        STATE.poisoned = False


def in_gradient_phase() -> bool:
    """True inside a resilient step before its optimizer step: the collectives of backward, which
    ``step_commit.py`` commits together."""
    with STATE.lock:
        return STATE.guards > 0 and not STATE.stepped


def pend_commit(settle) -> None:
    """``step_commit.py``: ``settle()`` is to run before the step's optimizer step (or at the step's
    end, if it has none)."""
    with STATE.lock:
        STATE.pending_commits.append(settle)


def settle_pending_commits() -> None:
    """Runs the pending step agreements (each may recover its group and void the step), oldest first."""
    with STATE.lock:
        pending, STATE.pending_commits = STATE.pending_commits, []
    for settle in pending:
        settle()


def end_step() -> bool:
    """The loop's step boundary: settles what is pending (a step without an optimizer step), resets
    the step's flags and returns whether an optimizer step was voided in it."""
    settle_pending_commits()
    with STATE.lock:
        skipped = STATE.skipped
        STATE.poisoned = STATE.skipped = STATE.stepped = False
    return skipped


def join_ready() -> bool:
    """True while a resilient loop runs that a promoted spare can join (given model, optimizer
    and iterated through ``epochs()``): only then does a failure bring in a spare."""
    with STATE.lock:
        return STATE.joinable > 0


def _void_poisoned_step(optimizer, args, kwargs):
    """Global optimizer-step pre-hook: in a poisoned step (a failure, or a gradient outlier under
    the "redo" policy), drop every gradient so the step is a no-op (optimizers skip parameters
    whose ``grad`` is None)."""
    if STATE.guards == 0:
        return None
    EXECUTOR.drain()
    with STATE.lock:
        STATE.stepped = True  # collectives from here on commit on their own
    settle_pending_commits()
    check = STATE.outlier_check
    if check is not None and not STATE.poisoned and check.judge()[0]:
        STATE.poisoned = True  # one rank's gradient was out of line: redo the step (same verdict on every rank)
    if STATE.poisoned:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        STATE.skipped = True
    return None


def install_hook() -> None:
    """Installs the optimizer-step pre-hook that voids a poisoned step (once per process)."""
    with STATE.lock:
        if STATE.hook is None:
            STATE.hook = _optim.register_optimizer_step_pre_hook(_void_poisoned_step)
