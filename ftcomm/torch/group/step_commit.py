"""Step-level commit: a resilient training step's gradient allreduces commit together.

A DDP step issues one allreduce per gradient bucket. Committed one by one, each pays an undo log
(a copy of its buffer, so that an abort can restore the inputs) and an agreement. Neither is
needed inside a resilient step: a step that fails is voided and redone from the batch, so the
gradients are recomputed and the buckets' inputs need not survive. So, inside such a step, the
process group runs the allreduces that backward issues uncommitted
(``Communicator.allreduce(commit=False)``: the ring in place, no undo log, no agreement) and one
agreement, in the optimizer-step pre-hook, commits them all:

- every rank completed all of them: the step goes on (a rank that died after its part is left
  out of the agreement, and the survivors' results are complete and equal);
- a rank's part failed (it revoked the communicator, its later uncommitted allreduces of the step
  are skipped): every rank recovers the group's communicator, the step is voided and redone, as
  after a failure anywhere else in the step.

A recovery earlier in the step (a committed collective failed on the revoked communicator) is
made by every survivor alike and voids the step already; the agreement is then skipped on every
rank. Collectives issued outside backward (a user's allreduce of the loss), after the optimizer step,
and outside a resilient step, commit on their own: their results are used as they come. An
agreement that times out (a live rank late past the deadline under ``FTCOMM_LATE_RANK=raise``)
raises ``CollectiveTimeoutError`` out of ``optimizer.step()``, as a committed allreduce would.
Where the data plane can (an inner gloo group on host tensors: ``InnerGroupPlane.start_allreduce``)
and nothing is queued before it, a bucket's allreduce is started from backward's own thread and
its Work completes from the transport's thread, as a plain torch backend's would; only its watch
runs on ftcomm's communication thread (``start``). With ``FTCOMM_FINGERPRINTS=1`` on the gloo and
NCCL planes, a fingerprint of each rank's bucket results rides in the agreement, and results that
differ void the step with no shrink (``step_fingerprints.py``). ``FTCOMM_STEP_COMMIT=0`` turns the
step commit off; so do the transit guard (``FTCOMM_CHECKSUMS``) and, on the ring plane, the
fingerprints (their verdict needs each ring allreduce's own commit agreement).
"""
from __future__ import annotations

import collections
import threading

import torch

from ... import settings
from ...core import fault
from ...errors import CollectiveTimeoutError, FtError, InvalidInputError, ProcFailedError
from .executor import EXECUTOR
from .step_fingerprints import (COMPLETED, StepFingerprints, agreement_flag, check_same_setting, committed,
                                fingerprints_equal, results_differ)
from .step_state import in_gradient_phase, pend_commit, void_current_step
from .work import FtWork, completed_work, make_future


class StepCommit:
    """The uncommitted collectives one process group ran in the current step.

    Args:
        group: the ``ProcessGroupFtcomm`` (``comm``, ``timeout``, ``_recover``).
    """

    def __init__(self, group):
        self.group = group
        self._lock = threading.Lock()  # start() runs in backward's thread, run() and watches on the communication thread
        self._in_flight = collections.deque()  # started buckets not yet watched to their end
        self._watching = False  # a watch task is queued or running (_watch_in_flight)
        self.comm = None    # the communicator this step's uncommitted collectives ran on
        self.error = None   # this rank's first failure among them
        self.name = None    # the collective, and the step id of its first call in this step:
        self.step = None    # what a recovery is reported at, the same on every rank
        self.results = StepFingerprints()  # the buckets whose results the agreement compares

    @staticmethod
    def applies(comm, tensors, plane) -> bool:
        """Whether a collective on ``tensors`` is to run uncommitted now: issued from inside a
        backward pass (DDP's gradient buckets; a user's allreduce of the loss, issued outside
        backward, commits on its own, so that its value is the same on every rank even in a voided
        step) of a resilient step before its optimizer step, on tensors that the data ``plane``
        moves as they are (device tensors it does not take are staged, and commit on their own),
        on a ULFM communicator, as the settings allow for this plane
        (``settings.buckets_on_data_plane``). The same on every rank (the settings must be; the
        rest is the training loop's)."""
        return (comm.ft_enabled and torch._C._current_graph_task_id() >= 0 and in_gradient_phase()
                and settings.buckets_on_data_plane(plane.name) and plane.takes(tensors))

    def run(self, comm, name: str, fn, tensors) -> None:
        """Runs ``fn(comm)`` (the collective ``name``, an allreduce of ``tensors`` with
        ``commit=False`` that returns its step id) as part of the step's commit. After this rank's
        first failure in the step, later ones are skipped: their results are discarded with the
        voided step. InvalidInputError is uniform and raised as it is."""
        if not self._admits(comm):
            return
        try:
            step, error = fn(comm), None
        except InvalidInputError:
            raise
        except FtError as failure:
            step, error = failure.step, failure
        self._note(name, step, error, tensors)

    def start(self, comm, name: str, tensors, op: str, plane) -> FtWork | None:
        """The bucket allreduce ``name`` of ``tensors``, started now from the caller's thread
        (``plane.start_allreduce``) as part of the step's commit, when nothing is queued on the
        communication thread before it. Returns its Work, which completes from the transport's
        thread; its watch, and the report of a failure, are queued on the communication thread.
        None when it cannot start here: the caller queues it through ``run``."""
        if EXECUTOR.collectives_queued():
            return None
        if not self._admits(comm):
            return completed_work(tensors, name)  # skipped after a failure, as in run
        started = plane.start_allreduce(comm, tensors, op, self.group.timeout)
        if started is None:
            return None
        self._note(name, started.step, None, tensors)
        future = make_future()
        once = threading.Lock()

        def complete() -> None:  # on success from the transport's thread, and after the watch
            if once.acquire(blocking=False):
                future.set_result(tensors)

        started.on_success(complete)
        self._watch_later(name, started, complete)
        return FtWork(future, name)

    def _watch_later(self, name: str, started, complete) -> None:
        """Queues the watch of ``started`` on the communication thread: one watch task for the
        buckets in flight together (one wake of that thread per step, not per bucket)."""
        with self._lock:
            self._in_flight.append((name, started, complete))
            if self._watching:
                return
            self._watching = True
        EXECUTOR.submit(self._watch_in_flight, watch=True)

    def _watch_in_flight(self) -> None:
        """Watches the started buckets, oldest first, until none is left; notes a failure."""
        while True:
            with self._lock:
                if not self._in_flight:
                    self._watching = False
                    return
                name, started, complete = self._in_flight.popleft()
            try:
                error = started.watch()
            except Exception as broken:  # noqa: BLE001 - this thread must go on, and the Work complete
                error = ProcFailedError(f"the watch of {name} failed: {broken!r}", step=started.step)
            if error is not None:
                self._note(name, started.step, error)
            complete()

    def _admits(self, comm) -> bool:
        """Whether a collective on ``comm`` joins the step's commit (pending its agreement from the
        first): not after this rank's first failure in the step, nor on an older communicator."""
        with self._lock:
            if self.comm is None:
                self.comm = comm
                pend_commit(self.settle)
            return self.error is None and comm is self.comm

    def _note(self, name: str, step: int, error, tensors=None) -> None:
        """Records a collective of the step: the first one's name and step id, the first error, and
        (``tensors``, with FTCOMM_FINGERPRINTS) the buckets whose results the agreement compares."""
        with self._lock:
            if self.error is None:
                self.error = error
            if self.name is None:
                self.name, self.step = name, step
            if tensors is not None and error is None and settings.fingerprints():
                self.results.add(step, tensors)

    def settle(self) -> None:
        """The step's one agreement, on every rank, before the optimizer step: recovers the
        group's communicator and voids the step if any rank's part failed; with FTCOMM_FINGERPRINTS,
        voids it (no shrink) if the ranks' results differ (``step_fingerprints.py``)."""
        with self._lock:
            comm, error, name, step, results = self.comm, self.error, self.name, self.step, self.results
            self.comm = self.error = self.name = self.step = None
            self.results = StepFingerprints()
        if comm is None or comm is not self.group.comm:
            return  # a recovery earlier in the step, on every survivor: already voided
        fault.point("step_commit", comm.world_rank, step if step is not None else -1)
        guarded = settings.fingerprints()
        fp = results.take(comm.world_rank) if guarded and error is None else None
        try:
            agreed = comm.agree(agreement_flag(error is None, guarded, fp), timeout=self.group.timeout)
        except CollectiveTimeoutError as late:
            # A live rank never arrived: no outcome can be uniform, so no recovery either (as a
            # committed allreduce's agreement that times out). Raised out of optimizer.step().
            raise CollectiveTimeoutError(f"the step agreement over the uncommitted {name} calls did not complete: "
                                         f"{late}", failed_ranks=late.failed_ranks, step=step) from error
        except FtError as failed:  # failures kept arriving during the agreement
            agreed, error = 0, error or failed
        if not agreed & COMPLETED:
            self._recover_or_raise(comm, name, _incomplete(name, step, error))
            return
        try:
            check_same_setting(comm, agreed, step, self.group.timeout)
            if not guarded or fingerprints_equal(agreed):
                comm.commit_uncommitted()  # the step ids, as each bucket's own commit would have
                if guarded:
                    committed()
                return
            voided = results_differ(comm, name, step, fp, self.group.timeout)
        except InvalidInputError:
            raise
        except FtError as failed:  # a rank failed during the naming round
            self._recover_or_raise(comm, name, _incomplete(name, step, failed))
            return
        void_current_step()  # redone from its batch
        comm.void_uncommitted()  # under the same step ids, as after a failure
        if voided.fenced:
            # The odd rank out killed itself: recover without it now, so that no code between this
            # step and its redo meets a communicator with a dead member.
            self._recover_or_raise(comm, name, ProcFailedError(
                f"world rank(s) {voided.fenced} fenced: their results differed again", step=step,
                failed_ranks=voided.fenced))
        elif voided.error is not None:
            raise voided.error

    def _recover_or_raise(self, comm, name: str, failure: ProcFailedError) -> None:
        """Some rank's part of the step failed: recovers the group's communicator (the step is
        voided and redone), or raises ``failure`` outside a resilient step."""
        if not self.group._recover(comm, name, failure):
            raise failure


def _incomplete(name: str, step, error) -> ProcFailedError:
    """The failure that voids a step whose uncommitted calls did not complete on every rank."""
    failure = ProcFailedError(f"the step's uncommitted {name} calls did not complete on every rank", step=step)
    failure.__cause__ = error
    return failure
