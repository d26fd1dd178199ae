"""Liveness and fencing for the layers above the core (csrc/core/liveness.h has the design):
every rank's process heartbeat and current ftcomm call in a shared table in ftcomm-run's run
directory, SIGKILL for a rank that is stopped or late past a collective's deadline, and a rank
fencing itself on its peers' verdict (``fence_self``). Also the watchdog for MPI calls that cannot
be interrupted (spawn, merge): past its deadline it kills this rank rather than hang."""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

from .. import _C


def describe(world_rank: int) -> str:
    """One line naming a rank and what it is doing ("world rank 2 (pid 4242): outside ftcomm for
    3.1 s, last in allreduce step 6"), as far as this host can see it."""
    return _C.liveness_describe(int(world_rank))


def finished(world_rank: int) -> bool:
    """True when ``world_rank`` is exiting, was fenced, is gone, or is not tracked on this host."""
    return bool(_C.liveness_finished(int(world_rank)))


def fence_silent(world_ranks, max_silence_s: float) -> list[int]:
    """SIGKILLs the ranks of ``world_ranks`` on this host that have been silent for longer than
    ``max_silence_s`` seconds; returns the world ranks it killed."""
    return list(_C.fence_silent([int(w) for w in world_ranks], float(max_silence_s)))


def fence_self(world_rank: int, why: str) -> None:
    """Fences this rank, found faulty by its peers' verdict (``why``, in words): says so on stderr
    and SIGKILLs itself, so that its peers see an ordinary process failure and go on without it
    (shrink, or a spare). Never returns."""
    print(f"ftcomm: world rank {world_rank} fences itself (pid {os.getpid()}): {why}; SIGKILL so that its peers go "
          "on without it", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def in_call(name: str, step: int):
    """Context manager: publishes that this rank waits in the collective ``name`` ("allreduce" or
    "allgather") of step ``step`` for the life of the block, so that a peer whose deadline passes
    judges it as waiting with it, not as late (``judge``). For waits that Python code runs itself;
    enter and leave it on one thread, and call ``beat`` while waiting."""
    return _C.ActivityScope(getattr(_C.Activity, name.upper()), int(step))


def beat() -> None:
    """Refreshes this rank's progress beat: it is still polling inside its current call (a peer
    judges a rank whose beat is older than a second as hung)."""
    _C.liveness_beat()


def judge(world_ranks) -> tuple[list[int], str]:
    """After a wait's deadline passed: judges the ranks of ``world_ranks`` on this host that kept
    it waiting, as the core's own waits do (csrc/core/liveness.h, ``Judge``): a stopped rank is
    fenced; a late one (outside ftcomm) or a hung one (in the call, not polling) is fenced under
    the late-rank policy "fence" and named under "raise"; a rank waiting in the same call and step
    is left alone. Returns (the world ranks fenced just now, one clause per rank judged)."""
    fenced, why = _C.liveness_judge([int(w) for w in world_ranks])
    return list(fenced), why


def fence_timeout() -> float:
    """Seconds of silence after which a waiting peer fences a rank (FTCOMM_FENCE_TIMEOUT)."""
    return float(_C.fence_timeout())


@contextmanager
def watchdog(seconds: float, what: str):
    """Runs the body under a watchdog: if it has not returned after ``seconds``, this rank is
    killed (SIGKILL), so that its peers see a failure instead of a hang. For MPI calls that
    cannot be polled against a deadline."""
    token = _C.watchdog_arm(float(seconds), what, False)
    try:
        yield
    finally:
        _C.watchdog_disarm(token)
