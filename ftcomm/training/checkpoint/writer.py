"""Asynchronous checkpoints of committed steps: the step pays for a copy into host memory, a
background thread writes, and one agreement per step boundary tells every rank whether the
write is done everywhere.

The life of one checkpoint, started after committed step S (the same S on every rank: the
schedule depends only on step ids and on what earlier agreements decided):

1. **stage** (the training thread): this rank's entries are copied into host buffers kept from
   one checkpoint to the next (``staging.py``). This is the step's only stall.
2. **write** (a background thread, at a lower priority than training: ``WRITER_NICENESS``): DCP's
   writer puts this rank's part in ``step S``'s temporary directory and fsyncs it
   (``dcp_parts.write_part``). Training goes on.
3. **agree** (every step boundary while the write is in flight): one ULFM agreement over the
   training communicator on "my part is on disk" and "my part did not fail". All done: the
   checkpoint is complete. One part failed: it is abandoned on every rank.
4. **publish** (rank 0's background thread): the parts are joined into DCP's ``.metadata``, the
   directory is renamed to its final name, and checkpoints older than the newest ``keep`` go
   (``directory.py``).

A failure anywhere (a rank dies while writing, staging, agreeing or renaming) leaves the complete
checkpoints as they were: a checkpoint becomes visible only by the final rename, and old ones are
removed only after it. After a recovery the training communicator is a new one: the write in
flight is abandoned on every survivor (its files are removed by the next publish). At most one
write is in flight: a checkpoint due while one is still being written is skipped (logged as
``checkpoint_skipped``); ``at_step`` checks completion before it starts the next one. At the end
of training ``finish`` writes a last checkpoint of the last committed step if none has it (it was
skipped, or it was not due), so that a finished run can be resumed without redoing anything.

Events logged (the caller's ``log``, ``ftcomm/training/events.py``'s format): ``checkpoint``
(step, bytes, stall_s, write_s, final: finish()'s last one), ``checkpoint_skipped``, ``checkpoint_abandoned`` (why),
``checkpoint_interval`` (an "auto" choice and the measurements behind it), and on rank 0
``checkpoint_published`` / ``checkpoint_publish_failed``.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ... import settings
from ...core import fault
from ...errors import FtError
from . import dcp_parts, directory
from .interval import Schedule
from .staging import StagingBuffers

_DONE, _OK = 1, 2  # low bits of the agreement value; the schedule's proposal sits above them
# The background writer's nice value. At the training threads' own priority it takes their cores
# (and the GIL between its writes): on these 2-core machines a loop of 512x512 matmuls beside it
# took 4.2x as long, a pure-Python loop 2.7x; at 10, 1.2x and 1.1x, and the write takes longer,
# which nobody waits for. At 19 it was starved when every core was busy; as SCHED_IDLE it slowed
# the steps beside it less but ran 3x as long, for about the same loss in all (10M parameters),
# and it could starve outright where ranks never leave a core idle.
WRITER_NICENESS = 10
_log = logging.getLogger("ftcomm.checkpoint")


def _no_log(**event) -> dict:
    return event


@dataclass
class _Write:
    step: int
    comm: object
    temporary: str
    future: Future
    stall_s: float
    started: float
    final: bool = False  # finish()'s last checkpoint, off the schedule


def _lower_priority() -> None:
    """The writer thread's start (Linux: a thread has a nice value of its own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
    except (AttributeError, OSError):
        pass


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


class AsyncCheckpointer:
    """Writes checkpoints of committed steps in the background (see the module docstring).

    Args:
        directory: where checkpoints go (made if missing; on several nodes a file system every
            node sees).
        every: steps between checkpoints (int >= 1), or "auto" (Young/Daly, ``interval.py``).
        mtbf_s: for "auto": mean seconds between failures that end the job (default FTCOMM_MTBF).
        keep: complete checkpoints kept (default 2: the newest and the one before it).
        log: ``log(**event)`` for the events above (default: none).
        timeout: deadline of each agreement, seconds (default FTCOMM_TIMEOUT).

    Raises:
        ValueError: a bad ``every`` or ``keep``, or "auto" without an MTBF.
    """

    def __init__(self, directory: str, every=10, *, mtbf_s: float | None = None, keep: int = 2, log=None,
                 timeout: float | None = None):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a number of checkpoints >= 1, not {keep!r}")
        self.schedule = Schedule(every, mtbf_s)
        self.root = os.path.abspath(directory)
        os.makedirs(self.root, exist_ok=True)
        self.keep, self.timeout = keep, timeout
        self.log = log or _no_log
        self.completed: list[int] = []   # steps whose checkpoint every rank finished writing
        self.skipped: list[int] = []
        self._staging = StagingBuffers()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftcomm-checkpoint",
                                        initializer=_lower_priority)
        self._write: _Write | None = None
        self._abandoned: list[Future] = []
        self._publishing: Future | None = None
        self._comm = None  # the communicator of the last step boundary
        self._boundary: float | None = None
        self._latest = None  # (step, entries, due) of the last boundary, for finish()'s last checkpoint

    # -- the step boundary ---------------------------------------------------------------------
    def at_step(self, comm, step: int, entries) -> None:
        """Called on every rank after every committed step: checks the write in flight (an
        agreement, only while one is in flight) and starts a checkpoint when one is due.

        Args:
            comm: the training communicator.
            step: the committed step's id.
            entries: this rank's part, {name: Whole | Piece | Blob} (``dcp_parts``), or a
                function returning it (called only when a checkpoint starts).

        Raises:
            ProcFailedError, RevokedError, CollectiveTimeoutError: the agreement failed; the
                write in flight is abandoned and the step stays committed (recover as after a
                failed step).
        """
        now = time.perf_counter()
        self.schedule.note_first_commit()
        if self._boundary is not None and comm is self._comm:
            self.schedule.note_step(now - self._boundary, writing=self._write is not None)
        if comm is not self._comm:
            self._follow(comm, step)
        self.poll(comm)
        due = self.schedule.due(step)
        self._latest = (step, entries, due)
        if due:
            if self._write is not None:
                self.skipped.append(step)
                self.log(event="checkpoint_skipped", step=step, in_flight=self._write.step)
            else:
                self._start(comm, step, entries)
        self._boundary = time.perf_counter()

    def _follow(self, comm, step: int) -> None:
        """A new communicator (a recovery, or this rank's first boundary): the write in flight
        belonged to the old one, and an "auto" schedule starts over from ``step`` (a promoted
        spare has measured nothing; every rank must be due at the same steps)."""
        if self._write is not None:
            self._abandon("the group changed (a recovery)")
        if self._comm is not None or self.schedule.auto:
            self.schedule.restart_from(step)
        self._comm = comm

    def poll(self, comm) -> None:
        """While a write is in flight: one agreement on whether every rank's part is on disk (a
        collective: every rank calls it at the same step boundary)."""
        w = self._write
        if w is None:
            return
        done = w.future.done()
        ok = not done or w.future.exception() is None
        flags = (_DONE if done else 0) | (_OK if ok else 0) | (self.schedule.proposal_bits() << 2)
        try:
            agreed = comm.agree(flags, timeout=self.timeout)
        except FtError:
            self._abandon("a failure during its agreement")
            raise
        if not agreed & _OK:
            if not ok:
                _log.error("checkpoint of step %d: this rank could not write its part: %s", w.step, w.future.exception())
            self._abandon("a rank could not write its part")
        elif agreed & _DONE:
            self._complete(comm, w, agreed >> 2)

    def _start(self, comm, step: int, entries, final: bool = False) -> None:
        """Stages this rank's part (the step's stall: gathering the entries, copying them) and
        hands it to the background thread."""
        t0 = time.perf_counter()
        self._wait_abandoned()  # their threads may still read the staging buffers
        temporary = directory.temporary_dir(self.root, step, self._token(comm))
        try:
            fault.point("checkpoint_stage", comm.world_rank, step)
            staged = self._staging.stage(entries() if callable(entries) else entries)
        except Exception as error:  # noqa: BLE001 - a local failure: the agreement abandons it everywhere
            future = _failed(error)
        else:
            future = self._pool.submit(self._write_part, temporary, comm.rank, comm.world_rank, step, staged)
        stall = time.perf_counter() - t0
        self._write = _Write(step, comm, temporary, future, stall, time.perf_counter(), final)
        self.schedule.started(step)

    @staticmethod
    def _token(comm) -> str:
        """What tells the temporary directories of different launches and groups apart, the same
        on every rank of one group: the launch number and a CRC of the group's world ranks."""
        return f"{settings.restart_count()}-{zlib.crc32(repr(tuple(comm.world_ranks)).encode()):08x}"

    @staticmethod
    def _write_part(temporary: str, rank: int, world_rank: int, step: int, staged: dict) -> dict:
        t0 = time.perf_counter()
        fault.point("checkpoint_write", world_rank, step)
        nbytes = dcp_parts.write_part(temporary, rank, staged)
        return {"bytes": nbytes, "seconds": time.perf_counter() - t0}

    def _complete(self, comm, w: _Write, proposal_bits: int) -> None:
        self._write = None
        result = w.future.result()
        self.schedule.note_write(w.stall_s, result["seconds"])
        self.completed.append(w.step)
        self.log(event="checkpoint", step=w.step, bytes=result["bytes"], stall_s=round(w.stall_s, 6),
                 write_s=round(result["seconds"], 6), world_size=comm.size, final=w.final)
        choice = self.schedule.adopt(proposal_bits)
        if choice is not None:
            self.log(event="checkpoint_interval", step=w.step,
                     **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in choice.items()})
        if comm.rank == 0:
            self._publishing = self._pool.submit(self._publish, w.temporary, w.step, comm.size, comm.world_rank)

    def _publish(self, temporary: str, step: int, ranks: int, world_rank: int) -> None:
        try:
            fault.point("checkpoint_publish", world_rank, step)
            dcp_parts.join_parts(temporary, ranks)
            fault.point("checkpoint_rename", world_rank, step)
            final = directory.publish(self.root, temporary, step)
            removed = directory.prune(self.root, self.keep, older_than=step)
        except (OSError, ValueError) as error:  # the parts' own errors come as CheckpointIOError (an OSError)
            self.log(event="checkpoint_publish_failed", step=step, error=str(error))
            print(f"ftcomm: the checkpoint of step {step} could not be published ({error}); the complete "
                  "checkpoints stay as they were", file=sys.stderr, flush=True)
            return
        self.log(event="checkpoint_published", step=step, path=final, removed=removed)

    def _abandon(self, why: str) -> None:
        w, self._write = self._write, None
        if w is None:
            return
        self._abandoned.append(w.future)
        self.log(event="checkpoint_abandoned", step=w.step, why=why)

    def _wait_abandoned(self) -> None:
        for future in self._abandoned:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - abandoned: its outcome no longer matters
                pass
        self._abandoned.clear()

    # -- the end ----------------------------------------------------------------------------
    def finish(self, comm, final: bool = True) -> None:
        """At the end of training, on every rank: waits for the write in flight and completes it
        (one agreement); then, with ``final``, writes a checkpoint of the last committed step the
        same way unless one has it already (the state has not changed since that step); and, on
        the publishing rank, waits until they are published. Collective when a write is in flight
        or a last checkpoint is due.

        Args:
            comm: the training communicator.
            final: False to write the last step's checkpoint only if the schedule made it due
                (and it was skipped because of the write in flight): a run that stops as if it
                had been killed there.

        Raises:
            ProcFailedError etc.: a rank failed; the checkpoint is abandoned.
        """
        in_flight = self._write.step if self._write is not None else None
        self._drain(comm)
        newest = max(self.completed[-1:] + ([in_flight] if in_flight is not None else []), default=None)
        if self._latest is not None and comm is self._comm and (final or self._latest[2]) and \
                (newest is None or newest < self._latest[0]):
            step, entries, _ = self._latest
            self._start(comm, step, entries, final=True)
            self._drain(comm)
        self.wait_published()

    def _drain(self, comm) -> None:
        w = self._write
        if w is None:
            return
        if w.comm is not comm:
            self._abandon("the group changed (a recovery)")
            return
        try:
            w.future.result()
        except Exception:  # noqa: BLE001 - reported by the agreement (poll)
            pass
        self.poll(comm)

    def wait_written(self) -> None:
        """Blocks until this rank's part of the write in flight is written, or has failed (not a
        collective: the next step boundary's agreement still decides whether it is complete)."""
        w = self._write
        if w is not None:
            try:
                w.future.result()
            except Exception:  # noqa: BLE001 - reported by the agreement (poll)
                pass

    def wait_published(self) -> None:
        """Blocks until this rank's publishing (if any) has ended."""
        if self._publishing is not None:
            self._publishing.result()
            self._publishing = None

    def close(self) -> None:
        """Ends the background thread, after what it is doing (no collective)."""
        self._pool.shutdown(wait=True)
