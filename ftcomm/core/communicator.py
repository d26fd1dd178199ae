"""ftcomm.Communicator: a fault-tolerant communicator over an mpi4py communicator.

The recovery verbs follow the ULFM chapter of the MPI Forum draft (mpi-forum/mpi-issues#20):
revoke (MPIX_Comm_revoke), shrink (MPIX_Comm_shrink), agree (MPIX_Comm_agree), failure ack
(MPIX_Comm_ack_failed / MPIX_Comm_get_failed). They are called from the C++ core, never through
mpi4py, whose fallbacks are not fault tolerant. Every blocking call has a deadline: the call's
``timeout`` argument, else the communicator's (``Communicator(timeout=...)``, inherited by the
communicators that shrink, recover and split make from it), else FTCOMM_TIMEOUT (default 600 s).
"""
from __future__ import annotations

import numpy as np

from .. import _C, settings
from ..errors import CollectiveMismatchError, FtError, InvalidInputError, UlfmUnavailableError
from . import cuda, events, fault, p2p, runtime
from .buffers import describe as describe_buffers
from .buffers import raw as raw_buffer
from .codes import InputProblem, RoundKind, Tag, op_code
from .events import RecoveryEvent


_timeout = settings.resolve_timeout
# The tags of ftcomm's own messages start here (csrc/core/tags.h); exchange refuses them to users.
_FIRST_RESERVED_TAG = 7000
_MAX_CHUNK_BYTES = 1 << 30  # the core's bound (a larger chunk is cut to it)


def _is_int64_value(value) -> bool:
    """An int (bools and numpy ints too) that the min/max round carries: in (-2**63, 2**63)."""
    return isinstance(value, (int, np.integer)) and -2**63 < int(value) < 2**63


def _chunk_bytes(value) -> tuple[int, str]:
    """The ring chunk to pass to the core (FTCOMM_CHUNK_BYTES when ``value`` is None) and, for a
    value that is not a positive integer, why it was refused (then the chunk passed is a
    placeholder: the step fails its validation on every rank)."""
    if value is None:
        return int(settings.chunk_bytes()), ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        return 1 << 20, f"chunk_bytes {value!r} was given"
    return int(min(value, _MAX_CHUNK_BYTES)), ""

# Recovery policies other than "shrink", by name: the membership layer registers "spares" and
# "respawn" (register_recovery_policy), so that this layer needs to know nothing of spare pools.
_POLICIES: dict = {}


def register_recovery_policy(name: str, handler) -> None:
    """Makes ``Communicator.recover(policy=name)`` call ``handler(comm, timeout_s)``, which returns
    the communicator to go on with (its ``recovery`` set). Called by ``ftcomm.membership``."""
    _POLICIES[name] = handler


def recovery_policies() -> tuple:
    """The policies ``recover`` accepts: "shrink" and the registered ones."""
    return ("shrink", *_POLICIES)


class Communicator:
    """A communicator whose collectives survive rank failures.

    Args:
        comm: an ``mpi4py.MPI.Comm`` (intra-communicator); default ``MPI.COMM_WORLD``. It is
            duplicated, so ftcomm's traffic and error handler never touch the caller's.
        timeout: the default deadline, in seconds, of the duplication (collective over ``comm``)
            and of every later blocking call on this communicator that names none (as torch's
            ``init_process_group(timeout=...)``); the communicators made from this one by
            shrink, recover and split inherit it. None: FTCOMM_TIMEOUT at each call.

    Raises:
        ValueError: ``timeout`` is not a positive number.
        ProcFailedError: a rank died while the communicator was created.
        CollectiveTimeoutError: a rank did not join within ``timeout``.
    """

    def __init__(self, comm=None, *, timeout: float | None = None, _core=None):
        # validated here, so that a bad value fails at construction and not at the first call
        self.timeout: float | None = None if timeout is None else _timeout(timeout)
        if _core is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD if comm is None else comm
            _core = _C.Communicator.create(comm, _timeout(timeout))
        self._core = _core
        self.old_to_new: list[int] | None = None  # set on a communicator made by shrink/recover
        self.promoted = False  # True on a spare or respawned process that joined by recover()
        self.recovery: RecoveryEvent | None = None  # what recover() did
        self._mpi_comm = None
        # Seconds of each phase of the last host allreduce that ran (validate_s, ring_s, agree_s):
        # for benchmarks that show where a small allreduce's time goes.
        self.last_phases: dict = {}
        # The highest step id an uncommitted allreduce used since the last commit: the next one
        # takes the id after it, and commit_uncommitted() records it.
        self._uncommitted_step = -1
        fault.say_unsaid()  # FTCOMM_FAULT in a job that cannot recover: said once, by a rank

    # -- identity ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the communicator (0 .. size-1)."""
        return self._core.rank

    @property
    def size(self) -> int:
        """Number of ranks (the world size of this communicator)."""
        return self._core.size

    @property
    def world_ranks(self) -> list[int]:
        """MPI_COMM_WORLD rank of each rank of this communicator."""
        return list(self._core.world_ranks)

    @property
    def world_rank(self) -> int:
        """This process's MPI_COMM_WORLD rank (stable across shrinks)."""
        return self._core.world_ranks[self._core.rank]

    @property
    def ft_enabled(self) -> bool:
        """True when MPI runs with ULFM on (``ftcomm.ulfm_status()`` says why not)."""
        return self._core.ft_enabled

    @property
    def mpi_comm(self):
        """An mpi4py communicator for the same MPI communicator (for baselines and debugging;
        traffic on it is not fault tolerant)."""
        if self._mpi_comm is None:
            self._mpi_comm = self._core.mpi_comm()
        return self._mpi_comm

    @property
    def last_committed_step(self) -> int:
        """Step id of the last committed collective (-1 before the first)."""
        return self._core.last_committed_step

    def set_ledger(self, step: int) -> None:
        """Sets the step ledger (``last_committed_step``). For a communicator assembled from
        ranks whose ledgers differ (survivors and newcomers): it takes the survivors' one, so that
        replay and the step order go on as before. Not for user code."""
        self._core.last_committed_step = int(step)

    def reserve_uncommitted_step(self) -> int:
        """The step id for an uncommitted collective that runs outside this communicator (the
        torch backend's other data planes): the next after the last committed and uncommitted
        ones, recorded as uncommitted, so that ``commit_uncommitted`` commits it with the rest. Local."""
        self._uncommitted_step = max(self.last_committed_step, self._uncommitted_step) + 1
        return self._uncommitted_step

    def commit_uncommitted(self) -> int:
        """Records the step ids of the uncommitted allreduces since the last commit as committed
        (``last_committed_step`` becomes the highest of them), once the caller's agreement found
        that every rank completed them. Local; call it on every rank after the same agreement.
        Returns the new ``last_committed_step``."""
        if self._uncommitted_step > self.last_committed_step:
            self.set_ledger(self._uncommitted_step)
        return self.last_committed_step

    def void_uncommitted(self) -> None:
        """Frees the step ids of the uncommitted collectives since the last commit, once the
        caller's agreement voided them on every rank (their results are discarded): the redo runs
        under the same ids, as a step voided by a failure does. Local; call it on every rank after
        the same agreement."""
        self._uncommitted_step = -1

    def _deadline(self, timeout) -> float:
        """A call's deadline in seconds: its own ``timeout``, else this communicator's, else
        FTCOMM_TIMEOUT."""
        return _timeout(self.timeout if timeout is None else timeout)

    def __repr__(self) -> str:
        return f"<ftcomm.Communicator rank {self.rank} of {self.size}, last committed step {self.last_committed_step}>"

    # -- ULFM verbs ----------------------------------------------------------------------
    def _require_ft(self, verb: str) -> None:
        if not self.ft_enabled:
            raise UlfmUnavailableError(f"{verb} needs ULFM, which this job lacks: {runtime.ulfm_status()} "
                                       "(see mpi_configs/README.md)")

    def revoke(self) -> None:
        """Revokes the communicator: every pending and later operation on it fails with
        RevokedError on every rank. Local, returns at once.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("revoke")
        self._core.revoke()

    @property
    def is_revoked(self) -> bool:
        """True once any rank revoked the communicator and this rank learned of it."""
        return self._core.is_revoked

    def failed_ranks(self) -> list[int]:
        """Acknowledges the failures this rank knows of and returns the failed ranks, sorted, in
        this communicator's numbering. Local: other ranks may know more or less.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("failed_ranks")
        return list(self._core.failed_ranks())

    def agree(self, flag: int, timeout: float | None = None) -> int:
        """Bitwise AND of ``flag`` (a non-negative int below 2**31) over the live ranks; every live
        rank gets the same value, even when a rank dies during the call (its contribution is
        then left out). Without ULFM it is an allreduce and assumes nobody fails.

        Raises:
            InvalidInputError (a ValueError): ``flag`` is not an int in [0, 2**31). Raised on this
                rank before any communication (an agreement has no room to carry the reason to
                the others, who then wait for this rank as for any late one).
            CollectiveTimeoutError: no agreement within ``timeout`` seconds.
            RevokedError, ProcFailedError: only if failures keep arriving during the call.
        """
        if not p2p.is_index(flag, 2**31):
            raise InvalidInputError(f"agree: flag must be an int in [0, 2**31), not {flag!r}")
        value, _saw_failure = self._core.agree(int(flag), self._deadline(timeout))
        return value

    def barrier(self, timeout: float | None = None) -> None:
        """Blocks until every rank arrives.

        Raises:
            ProcFailedError, RevokedError: a rank failed or the communicator was revoked.
            CollectiveTimeoutError: not every rank arrived within ``timeout`` seconds.
        """
        self._core.barrier(self._deadline(timeout))

    def shrink(self, timeout: float | None = None) -> "Communicator":
        """A new communicator over the live ranks, ranks consecutive and in the old order
        (MPIX_Comm_shrink). Collective over the survivors. ``result.old_to_new[r]`` is the new rank
        of old rank r, -1 for a failed one. MPI cannot interrupt a shrink: past ``timeout`` the
        watchdog kills this rank, so that a stuck rank cannot hold the others forever.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("shrink")
        core, old_to_new = self._core.shrink(self._deadline(timeout))
        return self._adopt(core, old_to_new)

    def recover(self, timeout: float | None = None, policy: str | None = None) -> "Communicator":
        """After a failed collective, the communicator on which to go on (collective over the
        survivors; with spares or respawn, over the newcomers too).

        Args:
            timeout: deadline in seconds for each phase.
            policy: ``"shrink"`` (default; FTCOMM_RECOVERY_POLICY changes the default): revoke (if
                not yet revoked) and shrink to the survivors, ranks consecutive in the old order;
                if the failed collective already shrank (it does, to agree on the failed ranks),
                that communicator. ``"spares"``: an idle spare (``ftcomm-run --spares S``) takes
                each failed rank's place, so the size and every survivor's rank stay as they were;
                when the spares run out the remaining places are closed as shrink does (logged,
                ``recovery.unfilled``). ``"respawn"``: new processes are started with
                MPI_Comm_spawn instead of spares; if spawning fails, shrink (logged). Newcomers
                have ``promoted`` True. ``result.recovery`` (a ``RecoveryEvent``) says what was
                done; ``result.old_to_new`` maps old ranks to new ones (-1: failed and not
                replaced). Protocols: ftcomm/membership/.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
            InvalidInputError (a ValueError): unknown policy.
        """
        policy = settings.recovery_policy() if policy is None else policy
        if policy not in recovery_policies():
            raise InvalidInputError(f"recover: policy must be one of {recovery_policies()}, not {policy!r}")
        self._require_ft("recover")
        if policy != "shrink":
            return _POLICIES[policy](self, self._deadline(timeout))
        shrunk = self.shrink_to_survivors(timeout)
        shrunk.recovery = events.between(self, shrunk, policy="shrink")
        return shrunk

    def shrink_to_survivors(self, timeout: float | None = None) -> "Communicator":
        """The survivors' communicator after a failure: the one the failed collective already
        built by its shrink, if it did; else revoke (if not yet revoked) and shrink. Collective
        over the survivors. Unlike ``recover``, never brings in newcomers.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        if self._core.has_recovered:
            core, old_to_new = self._core.take_recovered()
            return self._adopt(core, old_to_new)
        if not self._core.is_revoked:
            self.revoke()
        return self.shrink(timeout)

    def _adopt(self, core, old_to_new) -> "Communicator":
        new = Communicator(_core=core, timeout=self.timeout)
        new.old_to_new = list(old_to_new)
        runtime.record_lost(w for w, n in zip(self.world_ranks, old_to_new) if n < 0)
        return new

    def split(self, color: int, key: int, timeout: float | None = None) -> "Communicator | None":
        """MPI_Comm_split, confirmed by an agreement: the ranks with the same ``color`` (>= 0) form
        a new communicator, ordered by ``key``; a rank with ``color`` < 0 joins none and gets
        None. The new communicator starts with this one's step ledger. Collective; like shrink it
        cannot be interrupted, so past ``timeout`` the watchdog kills this rank.

        Raises:
            ProcFailedError, RevokedError: a rank failed during the split (local outcome).
        """
        core = self._core.split(int(color), int(key), self._deadline(timeout))
        return None if core is None else Communicator(_core=core, timeout=self.timeout)

    # -- signals (one int, point-to-point) --------------------------------------------------
    def signal(self, peer: int, tag: int, value: int, timeout: float | None = None) -> None:
        """Sends the int ``value`` to rank ``peer`` with ``tag`` (a ``Tag``); returns once it is
        delivered.

        Raises:
            ValueError: ``peer`` is not a rank of the communicator.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``exchange`` (local).
        """
        self._core.signal(int(peer), int(tag), int(value), self._deadline(timeout))

    def wait_signal(self, tag: int, timeout: float | None = None) -> tuple[int, int]:
        """Waits for one ``signal`` with ``tag`` from any rank. ``timeout`` None waits without a
        deadline (an idle spare waits for as long as the job runs). Returns (value, source rank).

        Raises:
            ProcFailedError, RevokedError: a failure was noticed or the communicator revoked.
            CollectiveTimeoutError: nothing arrived within ``timeout`` seconds.
        """
        return self._core.wait_signal(int(tag), -1.0 if timeout is None else self._deadline(timeout))

    def minmax(self, values, timeout: float | None = None, kind: RoundKind = RoundKind.MIN_MAX
               ) -> tuple[list[int], list[int]]:
        """Element-wise (min, max) over the ranks of ``values`` (ints in (-2**63, 2**63), the same
        count on every rank), by one round of small messages (csrc/collectives/minmax_round.h).
        ``kind`` says which round this is (``ftcomm._C.RoundKind``; ftcomm's own input checks pass
        theirs): a rank whose peer is in another kind of round, or passed another count, does not
        merge its values.

        Raises:
            CollectiveMismatchError: on every rank, when ranks are in different kinds of round or
                passed different counts, naming two of them and what each was in.
            InvalidInputError: on every rank, when a rank passed a value that is not an int in
                that range, naming it (and, on that rank, the value).
            ProcFailedError, RevokedError, CollectiveTimeoutError: a local outcome, as ``exchange``.
        """
        values = list(values)
        bad = next(((i, v) for i, v in enumerate(values) if not _is_int64_value(v)), None)
        ints = [0] * len(values) if bad is not None else [int(v) for v in values]
        try:
            mins, maxs = _C.minmax(self._core, ints, self._deadline(timeout), RoundKind(kind), bad is not None)
        except InvalidInputError as error:
            if bad is None or isinstance(error, CollectiveMismatchError):
                raise
            raise InvalidInputError(f"{error} (here: value {bad[1]!r} at index {bad[0]})") from None
        return list(mins), list(maxs)

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, buffers, op: str = "sum", step: int | None = None,
                  timeout: float | None = None, chunk_bytes: int | None = None,
                  checksums: bool | None = None, fingerprints: bool | None = None, commit: bool = True) -> int:
        """Fault-aware ring allreduce, in place, committed as one step (or, ``commit=False``, left for
        the caller to commit).

        Args:
            buffers: a contiguous, writable numpy array or torch CPU tensor, or a list of them
                (a bucket reduced as one step). Or CUDA buffers (torch CUDA tensors, CuPy arrays,
                ``__cuda_array_interface__`` objects), all on one device, never mixed with host
                buffers in one step: staged through pinned host memory, written only on commit,
                ordered on the producer's current stream (docs/GPU.md). dtypes: float32, float64, float16, bfloat16 (each
                operation in float32, rounded back), int32, int64 (wrapping). Any length.
            op: "sum", "avg", "min", "max" or "prod". avg on integers truncates toward zero.
            step: the step id; default last committed + 1 (uncommitted: after the last uncommitted
                one too, see ``commit_uncommitted``). A step equal to the last committed one
                is a replay: no data moves and the buffer keeps the committed result, after one
                input-check round with the peers (a failure found there is left to the next
                call). A step below it, or different between ranks, is an error on every rank.
            timeout: deadline in seconds for the whole step.
            chunk_bytes: pipelining chunk of the ring, bytes (default FTCOMM_CHUNK_BYTES, 1 MiB).
            checksums: the transit guard against silent data corruption (default
                FTCOMM_CHECKSUMS, off): each ring chunk's sum of 32-bit words is checked on
                arrival against its sender's before the commit (CUDA buffers: on their pinned
                host copy). The same on every rank.
            fingerprints: result fingerprints (default FTCOMM_FINGERPRINTS, off): after the ring
                each rank hashes its whole result (one more read pass) and a 14-bit fingerprint
                is compared in the commit agreement, which catches a flip in a rank's memory
                after the data arrived. Turns the checksums on too (without them a flip in
                transit, forwarded around the ring, could put the majority on the wrong side).
                The same on every rank.
            commit: False runs the step uncommitted: validated as a committed one (bad input is
                the same ``InvalidInputError`` on every rank, buffers untouched), then the ring in
                place with no undo log and no agreement, and the step id is not recorded. A rank
                whose ring fails revokes the communicator and raises its own error
                (ProcFailedError, RevokedError, CollectiveTimeoutError) while another rank may have
                succeeded; its buffers then hold no defined value. The caller makes the outcome
                uniform with one ``agree`` over several such calls (the torch backend's step-level
                commit: a training step's gradient buckets, ftcomm/torch/group/step_commit.py). Must be the
                same on every rank; checksums and fingerprints must be off (their verdict rides in
                the commit agreement).

        Returns:
            The step id committed (or replayed; for ``commit=False``, the step id passed).

        Raises:
            InvalidInputError: on every rank, when any rank passed a bad buffer, op or step, or
                ranks disagree on lengths or dtypes. No buffer was touched.
            ProcFailedError: a rank died. Every survivor raises it with the same ``step`` and
                ``failed_ranks``, its buffers bitwise as before the call. ``recover()`` then gives
                the communicator on which to retry the step.
            RevokedError: the communicator was revoked (by a failure elsewhere); same rules.
            CollectiveTimeoutError: a peer stopped answering within ``timeout``.
            SilentCorruptionError: with checksums, data arrived corrupted somewhere (``.ranks``:
                [sender, receiver] world ranks); with fingerprints, the ranks' results differ (its subclass
                ``ResultsDifferError``; ``.ranks``: the ones that differ from the majority, or
                all without one); on every rank, buffers
                bitwise as before, the communicator still usable: redo the step.

        Algorithm: reduce-scatter then allgather around the ring (Patarasuk & Yuan, JPDC 2009),
        pipelined by chunk; commit by one ULFM agreement (docs/DESIGN.md).
        """
        bufs = describe_buffers(buffers)
        code = op_code(op)
        problem = bufs.problem
        if code is None and problem == InputProblem.NONE:
            problem = InputProblem.UNSUPPORTED_OP
            bufs.detail = f"op {op!r} was given"
        if step is None:
            step = self.last_committed_step + 1 if commit else max(self.last_committed_step, self._uncommitted_step) + 1
        uncommitted_before = self._uncommitted_step
        if not commit:
            self._uncommitted_step = max(self._uncommitted_step, int(step))
        chunk, chunk_problem = _chunk_bytes(chunk_bytes)
        if problem == InputProblem.NONE and chunk_problem:
            problem, bufs.detail = InputProblem.BAD_CHUNK_BYTES, chunk_problem
        if problem == InputProblem.NONE and not commit and bufs.device is not None:
            problem = InputProblem.UNCOMMITTED_DEVICE  # the host path validates it, touching no buffer
        args = (code or 0, int(step), self._deadline(timeout), chunk, int(problem))
        guard = settings.checksums() if checksums is None else bool(checksums)
        compare = settings.fingerprints() if fingerprints is None else bool(fingerprints)
        try:
            if bufs.device is not None and commit:  # device buffers, staged through pinned host memory
                cuda.staged_allreduce(self._core, bufs, *args, guard, compare)
            else:
                # device quads come here only with a problem (never touched): the host path takes triples
                triples = bufs.triples if bufs.device is None else [t[:3] for t in bufs.triples]
                _, validate_s, ring_s, agree_s = self._core.allreduce(triples, *args, guard, compare, bool(commit))
                self.last_phases = {"validate_s": validate_s, "ring_s": ring_s, "agree_s": agree_s}
        except InvalidInputError as error:
            self._uncommitted_step = uncommitted_before  # nothing ran: the id is free again
            if isinstance(error, CollectiveMismatchError):
                raise  # the peers are in other collectives: no detail round to share with them
            raise self._with_offender_detail(error, bufs.detail, timeout) from None
        return int(step)

    def reduce_scatter(self, input, output, op: str = "sum", step: int | None = None,  # noqa: A002
                       timeout: float | None = None, chunk_bytes: int | None = None,
                       checksums: bool | None = None) -> int:
        """Fault-aware ring reduce-scatter, committed as one step: ``output`` on rank r receives
        segment r of the elementwise reduction of every rank's ``input``.

        Args:
            input: a contiguous host buffer (numpy array or torch CPU tensor) of ``N * M``
                elements, N the world size: N segments of M elements. Only read; may be
                read-only, and ``output`` may be a view of it (torch's in-place form).
            output: a contiguous, writable host buffer of ``M`` elements, same dtype. Written
                only when the step commits.
            op, step, timeout, chunk_bytes: as ``allreduce``.
            checksums: the transit guard, as ``allreduce`` (default FTCOMM_CHECKSUMS, off); the
                sums of the input sent at the first ring step take one read pass over 1/N of it,
                the others ride in the reduction's loop.

        Returns:
            The step id committed (or replayed).

        Raises:
            InvalidInputError: on every rank, when any rank passed a bad buffer, an output that is
                not 1/N of its input, an op or a step that is wrong, or ranks disagree on lengths
                or dtypes. Nothing was touched.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``allreduce``; ``input`` and
                ``output`` are bitwise as before the call on every survivor.
            SilentCorruptionError: with checksums, data arrived corrupted somewhere (``.ranks``:
                [sender, receiver] world ranks), on every rank; ``output`` unchanged, nothing
                committed: redo the step.

        Algorithm: the reduce-scatter half of the ring allreduce (Patarasuk & Yuan, JPDC 2009):
        N-1 ring steps, (N-1)/N of the input sent and received per rank, half an allreduce's
        traffic. Partial sums live in scratch, so an abort needs no undo log.
        """
        src = describe_buffers(input, writable=False)
        dst = describe_buffers(output)
        code = op_code(op)
        problem, detail = src.problem, src.detail.replace("buffer 0", "the input")
        if problem == InputProblem.NONE:
            problem, detail = dst.problem, dst.detail.replace("buffer 0", "the output")
        if problem == InputProblem.NONE and (src.device is not None or dst.device is not None):
            problem, detail = InputProblem.MIXED_DEVICES, "a CUDA buffer was given (the torch backend stages CUDA tensors)"
        if problem == InputProblem.NONE and code is None:
            problem, detail = InputProblem.UNSUPPORTED_OP, f"op {op!r} was given"
        empty = (0, 0, 0)
        in_triple = src.triples[0] if problem == InputProblem.NONE else empty
        out_triple = dst.triples[0] if problem == InputProblem.NONE else empty
        if problem == InputProblem.NONE and (in_triple[2] != out_triple[2] or in_triple[1] != out_triple[1] * self.size):
            detail = (f"its input has {in_triple[1]} elements and its output {out_triple[1]} "
                      f"(needs {self.size} x output), dtype codes {in_triple[2]} and {out_triple[2]}")
        chunk, chunk_problem = _chunk_bytes(chunk_bytes)
        if problem == InputProblem.NONE and chunk_problem:
            problem, detail = InputProblem.BAD_CHUNK_BYTES, chunk_problem
        if step is None:
            step = self.last_committed_step + 1
        args = (code or 0, int(step), self._deadline(timeout), chunk, int(problem))
        try:
            guard = settings.checksums() if checksums is None else bool(checksums)
            _, validate_s, ring_s, agree_s = self._core.reduce_scatter(in_triple, out_triple, *args, guard)
            self.last_phases = {"validate_s": validate_s, "ring_s": ring_s, "agree_s": agree_s}
        except InvalidInputError as error:
            if isinstance(error, CollectiveMismatchError):
                raise  # the peers are in other collectives: no detail round to share with them
            raise self._with_offender_detail(error, detail, timeout) from None
        return int(step)

    def _with_offender_detail(self, error: InvalidInputError, detail: str, timeout) -> InvalidInputError:
        """The validation's error completed with what the offending rank saw of its own input
        (which buffer, its dtype or device, the op it gave), the same text on every rank: one
        min/max round finds the highest rank with such a detail, one broadcast shares it. Every
        rank got the same error, so every rank runs these two rounds; if they fail, the error
        goes as it was."""
        try:
            _, maxs = self.minmax([self.rank if detail else -1], timeout=timeout)
            if maxs[0] < 0:
                return error
            root = maxs[0]
            text = self.broadcast_bytes(detail.encode() if self.rank == root else None, root, timeout=timeout)
        except FtError:
            return error
        return InvalidInputError(f"{error}; rank {root} (world rank {self.world_ranks[root]}) saw: {text.decode()}",
                                 step=error.step)

    def exchange(self, sends=(), recvs=(), tag: int = 0, timeout: float | None = None) -> None:
        """Point-to-point batch: every ``(peer, buffer)`` in ``sends`` is sent to ``peer`` and
        every one in ``recvs`` received from it (bytes; sizes must match the peer's), all posted
        at once and completed under one deadline. Local outcome: on failure the communicator is
        revoked so that peers waiting on this rank fail too; callers that need every rank to
        agree on the outcome follow it with ``agree``.

        Raises:
            ProcFailedError, RevokedError: a peer failed or the communicator was revoked.
            CollectiveTimeoutError: not complete within ``timeout`` seconds.
            InvalidInputError: a buffer is not contiguous host memory, a peer rank is invalid, or
                ``tag`` is not an int in [0, 7000) (from 7000 up the tags are ftcomm's own,
                ``ftcomm.core.codes.Tag``: a message there would be taken by ftcomm's collectives).
        """
        # Checked here, before anything is posted: the core revokes the communicator on any error
        # once transfers are in flight, and a typo in a peer rank should not cost the communicator.
        if not isinstance(tag, Tag) and not p2p.is_index(tag, _FIRST_RESERVED_TAG):
            raise InvalidInputError(f"exchange: tag {tag!r} is not an int in [0, {_FIRST_RESERVED_TAG}) "
                                    "(ftcomm's own messages use the tags from there up)")
        for p, _ in (*sends, *recvs):
            if not p2p.is_index(p, self.size):
                raise InvalidInputError(f"exchange: peer {p!r} is not a rank of the communicator (0..{self.size - 1})")
        send_list = [(int(p), *raw_buffer(b, writable=False)) for p, b in sends]
        recv_list = [(int(p), *raw_buffer(b, writable=True)) for p, b in recvs]
        _C.exchange(self._core, send_list, recv_list, int(tag), self._deadline(timeout))

    def allgather(self, sendbuf, recvbuf, timeout: float | None = None) -> None:
        """Ring allgather: ``recvbuf`` (``size * len(sendbuf)`` elements, same dtype, contiguous)
        receives every rank's ``sendbuf`` in rank order. N-1 ring steps of one ``exchange`` each.

        Input is validated across ranks first (one small round of messages): a bad buffer on any
        rank, or sizes or dtypes that differ between ranks, raise the same InvalidInputError on
        every rank before any buffer is touched. Failures during the transfer are a local outcome,
        as for ``exchange``; ``timeout`` is in seconds, per phase.

        Raises:
            InvalidInputError: on every rank, as above.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``exchange`` (local).
        """
        p2p.allgather(self, sendbuf, recvbuf, timeout)

    def broadcast(self, buf, root: int = 0, timeout: float | None = None) -> None:
        """Sends ``buf`` from ``root`` to every rank, in place (binomial tree). Input (``root``, the
        buffer's size and dtype) is validated across ranks first, as for ``allgather``; failures
        during the transfer are a local outcome, as ``exchange``. ``timeout`` in seconds, per phase.

        Raises:
            InvalidInputError: on every rank: a bad buffer or root on some rank, or roots, sizes or
                dtypes that differ between ranks. ``buf`` untouched.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``exchange`` (local).
        """
        p2p.broadcast(self, buf, root, timeout)

    def broadcast_bytes(self, data: bytes | None, root: int = 0, timeout: float | None = None) -> bytes:
        """``data`` (given on ``root``; None elsewhere) on every rank, of any length: its length
        (one int64) is broadcast first, then its bytes. ``timeout`` in seconds, per phase.

        Returns:
            The root's bytes.
        Raises:
            As ``broadcast`` (InvalidInputError on every rank for a bad root; ProcFailedError,
            RevokedError, CollectiveTimeoutError as a local outcome).
        """
        return p2p.broadcast_bytes(self, data, root, timeout)

    def require_same(self, what: str, value: str, timeout: float | None = None) -> None:
        """Checks that ``value`` (a short text describing this rank's ``what``: its param groups'
        sizes, say) is the same on every rank. Collective: rank 0's text is broadcast, then one
        min/max round finds the highest rank that differs and one broadcast shares its text.

        Raises:
            InvalidInputError: on every rank, naming rank 0's and the differing rank's world ranks
                and values.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``broadcast``.
        """
        first = self.broadcast_bytes(value.encode() if self.rank == 0 else None, 0, timeout=timeout).decode()
        _, maxs = self.minmax([self.rank if value != first else -1], timeout=timeout)
        if maxs[0] < 0:
            return
        other = maxs[0]
        theirs = self.broadcast_bytes(value.encode() if self.rank == other else None, other, timeout=timeout)
        raise InvalidInputError(f"{what} differ between ranks: rank 0 (world rank {self.world_ranks[0]}) has "
                                f"{first}, rank {other} (world rank {self.world_ranks[other]}) has {theirs.decode()}")


__all__ = ["Communicator", "register_recovery_policy", "recovery_policies"]
