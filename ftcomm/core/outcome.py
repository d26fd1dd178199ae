"""Two patterns every fault-tolerant protocol above the core repeats, written once.

``agreed``: a phase whose outcome is local on each rank (point-to-point traffic, a file write)
must end the same way on every rank. Each rank runs its part, notes whether it failed, and one
ULFM agreement (MPIX_Comm_agree, an AND over the live ranks) decides: all go on, or all raise.

    with agreed(comm, f"step {step}", step=step, on_abort=store.discard_pending):
        update(); allgather(); replicate()          # an FtError here fails this rank's part

``redone_on_corruption``: a step voided by silent data corruption (the same
``SilentCorruptionError`` on every rank, buffers as before, nobody failed) is simply run again.

``retrying``: recover from a failure and run the interrupted phase again, as often as failures
come, up to a limit (recovery from a failure during recovery).

    for attempt in retrying(8, on_failure=lambda error: ...):
        with attempt:
            comm = comm.recover(); report = rebuild(comm)
"""
from __future__ import annotations

from contextlib import contextmanager

from ..errors import FtError, ProcFailedError, RevokedError, SilentCorruptionError
from .events import note_corruption


class Outcome:
    """This rank's part of an agreed phase: ``ok`` until ``fail`` is called (or the body raised)."""

    def __init__(self):
        self.ok = True
        self.error: BaseException | None = None

    def fail(self, error: BaseException | None = None) -> None:
        """Marks this rank's part failed (``error``: why, kept as the raised error's cause)."""
        self.ok = False
        self.error = error or self.error


@contextmanager
def agreed(comm, what: str, *, step: int | None = None, timeout: float | None = None,
           catch=(FtError,), keep=(), on_abort=None):
    """Runs the body as this rank's part of a phase, then agrees over ``comm`` on whether every
    rank's part succeeded. Yields an ``Outcome`` (call ``fail()`` to fail without raising).

    Args:
        comm: the ``Communicator`` to agree over.
        what: the phase, for the error message ("step 12", "rebuild of step 4").
        step: the step id the raised error carries.
        timeout: deadline of the agreement, seconds (default FTCOMM_TIMEOUT).
        catch: errors of the body that fail this rank's part (default: any FtError).
        keep: errors of the body that propagate as they are, without the agreement: raise them
            only where every rank raises them alike (a uniform outcome needs no agreement).
        on_abort: called on every rank when the phase failed somewhere, before the raise (undo
            what the body prepared).

    Raises:
        ProcFailedError: on every rank when any rank's part failed (its cause: this rank's own
            error, if it had one).
        CollectiveTimeoutError: the agreement itself did not complete in time.
    """
    outcome = Outcome()
    try:
        yield outcome
    except keep:
        raise
    except catch as error:
        outcome.fail(error)
    if not comm.agree(1 if outcome.ok else 0, timeout=timeout):
        if on_abort is not None:
            on_abort()
        raise ProcFailedError(f"{what} did not complete on every rank: a rank failed", step=step) \
            from outcome.error


class Attempt:
    """One try of ``retrying``: a context manager that swallows the errors to retry on."""

    def __init__(self, number: int, retry_on):
        self.number = number  # 0 for the first try
        self.error: BaseException | None = None
        self._retry_on = retry_on

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and isinstance(exc, self._retry_on):
            self.error = exc
            return True
        return False


def retrying(max_attempts: int | None = 8, *, retry_on=(ProcFailedError, RevokedError), on_failure=None):
    """Yields ``Attempt``s until one's body completes. After a failed attempt ``on_failure(error)``
    runs (it usually recovers the communicator; it may raise to stop retrying).

    Args:
        max_attempts: tries in all; None: no limit (for protocols whose every retry follows a
            real failure, so that the number of tries is bounded by the number of ranks).
        retry_on: errors of the body that mean "recover and try again".
        on_failure: ``f(error)`` between a failed attempt and the next.

    Raises:
        The last attempt's error, after ``max_attempts`` failed attempts.
    """
    number = 0
    while True:
        attempt = Attempt(number, retry_on)
        yield attempt
        if attempt.error is None:
            return
        number += 1
        if max_attempts is not None and number >= max_attempts:
            raise attempt.error
        if on_failure is not None:
            on_failure(attempt.error)


def redone_on_corruption(fn, where: str, attempts: int = 3):
    """Returns ``fn()``; when it raises ``SilentCorruptionError`` (uniform: every rank raised it,
    nothing committed, buffers bitwise as before) runs it again, ``attempts`` times in all. Each
    time is recorded (``events.note_corruption``).

    Raises:
        SilentCorruptionError: the last one, when every attempt was corrupted (corruption that
            repeats is not transient: a faulty rank, to be fenced by the caller's policy).
    """
    for attempt in range(attempts):
        try:
            return fn()
        except SilentCorruptionError as error:
            last = attempt == attempts - 1
            note_corruption(error, where, "raised" if last else "redone")
            if last:
                raise
