"""ftcomm's exceptions. Every collective either completes on all live ranks or raises one of these
on all of them, with the same ``step`` and ``failed_ranks`` (README, "Fault semantics").

Every layer raises these, so they sit below all of them; the core's status codes are mapped to
them in ``ftcomm.core.codes``."""
from __future__ import annotations


class FtError(RuntimeError):
    """Base class of ftcomm errors.

    Attributes:
        step: the step id of the collective that failed, or None.
        failed_ranks: ranks (in the numbering of the communicator the call was made on) known to
            have failed; agreed among the survivors when raised by a collective.
    """

    def __init__(self, message: str, failed_ranks=(), step: int | None = None):
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)
        self.step = step


class ProcFailedError(FtError):
    """One or more ranks died (ULFM's MPI_ERR_PROC_FAILED). Call ``recover()`` and retry."""


class RevokedError(FtError):
    """The communicator was revoked (MPI_ERR_REVOKED). Call ``recover()`` and retry."""


class CollectiveTimeoutError(FtError, TimeoutError):
    """A deadline passed: a peer stopped answering without dying (MPI cannot see that)."""


class UlfmUnavailableError(FtError):
    """A recovery verb (revoke, shrink, failed_ranks, recover) was called but this job runs
    without ULFM. Raised at once, on every rank that calls it, before any communication; the
    message carries ``ftcomm.ulfm_status()``, which says why.

    Recovery needs Open MPI 5 launched with ULFM on (``ftcomm-run``, i.e. ``mpirun --with-ft
    ulfm``). MPICH's releases cannot recover (their ch4 device has no fault tolerance): on MPICH
    ftcomm runs failure-free only. See mpi_configs/README.md.
    """


class InvalidInputError(FtError, ValueError):
    """Bad input on some rank (a buffer, dtype, op, length or step id); raised on every rank."""


class CollectiveMismatchError(InvalidInputError):
    """Ranks called different collectives at once (an allreduce on one, a broadcast on another),
    or passed a min/max round different numbers of values: a program error, found in the input
    check's round before any buffer is touched and raised on every rank. The message names two
    ranks (world ranks too) and what each was in; the communicator stays usable."""


class MpiError(FtError):
    """Any other MPI error."""


class SilentCorruptionError(FtError):
    """Silent data corruption: data arrived corrupted (a ring chunk's checksum did not match its
    sender's), the ranks' results differ (their fingerprints in the commit agreement), or a state
    check found a diverged rank without a majority. The step was voided on every rank, nothing
    committed, every buffer bitwise as before; redo the step on the same communicator (no rank
    failed, ``failed_ranks`` is empty).

    Attributes:
        ranks: the implicated MPI_COMM_WORLD ranks, the same on every rank: [sender, receiver]
            of corrupted data; the ranks whose result differs from the majority's (every rank
            without a strict majority); empty if they could not be agreed on.
        checked: what caught it: "ring chunk checksums", "result fingerprints", or the state
            check's description.
    """

    def __init__(self, message: str, ranks=(), step: int | None = None, failed_ranks=(),
                 checked: str = "ring chunk checksums"):
        super().__init__(message, failed_ranks=failed_ranks, step=step)
        self.ranks = list(ranks)
        self.checked = checked


class ResultsDifferError(SilentCorruptionError):
    """The ranks' allreduce results differ (their fingerprints in the commit agreement, with
    fingerprints on): a flip in some rank's memory after the data arrived. Voided on every rank,
    buffers bitwise as before; redo the step. ``ranks``: the world ranks whose result differs from
    a strict majority's (every rank without one); ``checked``: "result fingerprints"."""

    def __init__(self, message: str, ranks=(), step: int | None = None, failed_ranks=(),
                 checked: str = "result fingerprints"):
        super().__init__(message, ranks=ranks, step=step, failed_ranks=failed_ranks, checked=checked)


class StateLostError(FtError):
    """A shard and all of its replicas were lost together: in-memory recovery is impossible.

    Attributes:
        lost_shards: the shard ids (owner ranks before the failure) with no surviving copy.
    """

    def __init__(self, message: str, lost_shards=(), step: int | None = None, failed_ranks=()):
        super().__init__(message, failed_ranks=failed_ranks, step=step)
        self.lost_shards = list(lost_shards)
