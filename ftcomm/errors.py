"""ftcomm's exceptions. Every collective either completes on all live ranks or raises one of these
on all of them, with the same ``step`` and ``failed_ranks`` (see docs/SEMANTICS.md)."""
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
    """A recovery verb was called but MPI runs without ULFM.

    Launch with ``ftcomm-run`` (or ``mpirun --with-ft ulfm``) on Open MPI 5, or with an MPICH built
    with ch3:tcp and ``MPIR_CVAR_ENABLE_FT=1``; see mpi_configs/README.md.
    """


class InvalidInputError(FtError, ValueError):
    """Bad input on some rank (a buffer, dtype, op, length or step id); raised on every rank."""


class MpiError(FtError):
    """Any other MPI error."""


class StateLostError(FtError):
    """A shard and all of its replicas were lost together: in-memory recovery is impossible.

    Attributes:
        lost_shards: the shard ids (owner ranks before the failure) with no surviving copy.
    """

    def __init__(self, message: str, lost_shards=(), step: int | None = None, failed_ranks=()):
        super().__init__(message, failed_ranks=failed_ranks, step=step)
        self.lost_shards = list(lost_shards)


# Mirrors ftcomm::StatusCode in csrc/core/status.h.
_BY_CODE = {
    1: ProcFailedError,
    2: RevokedError,
    3: CollectiveTimeoutError,
    4: UlfmUnavailableError,
    5: InvalidInputError,
    6: MpiError,
}


def from_status(code: int, message: str, failed_ranks, step: int) -> FtError:
    """Builds the exception for a core status (called by the bindings)."""
    cls = _BY_CODE.get(code, FtError)
    return cls(message, failed_ranks=failed_ranks, step=None if step < 0 else step)
