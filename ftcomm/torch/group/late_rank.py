"""What the torch backend does with a live rank that is late past a collective's deadline, unless
FTCOMM_LATE_RANK says otherwise.

torch's own backends raise a timeout error on the ranks that waited and leave the late rank alone,
and code written for them (torch's test suite among it) expects that. ftcomm fences a late rank
(SIGKILL, so that ULFM reports it failed) where that serves recovery: inside a resilient loop,
where the survivors then redo the step without it. So, with FTCOMM_LATE_RANK unset:

- outside ``ftcomm.torch.resilient``: the waiting ranks raise ``CollectiveTimeoutError`` naming
  the late rank, which lives on;
- inside it: the late rank is fenced and the step redone over the survivors.

A stopped rank (no heartbeat for FTCOMM_FENCE_TIMEOUT) is fenced in both: it will never arrive.
"""
from __future__ import annotations

import threading

from ... import settings
from ...core import runtime

_lock = threading.Lock()
_loops = 0  # resilient loops running in this process


def use_torch_default() -> None:
    """Called when an ftcomm process group is created: late ranks are named, not fenced, outside
    resilient loops (unless FTCOMM_LATE_RANK is set)."""
    with _lock:
        _apply()


def loop_started() -> None:
    """A resilient loop starts its steps: late ranks are fenced while one runs (unless
    FTCOMM_LATE_RANK is set). Paired with ``loop_ended``."""
    global _loops
    with _lock:
        _loops += 1
        _apply()


def loop_ended() -> None:
    global _loops
    with _lock:
        _loops -= 1
        _apply()


def _apply() -> None:
    """Fences late ranks while a resilient loop runs, names them otherwise; FTCOMM_LATE_RANK, when
    set, stays in force. Called under ``_lock``."""
    if not settings.late_rank_is_set():
        runtime.set_late_rank_fence(_loops > 0)
