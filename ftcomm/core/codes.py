"""The codes Python and the C++ core share, read from the core's own enums (``ftcomm._C``), so
that nothing is mirrored by hand: status codes and the exception each one raises, element types,
reduction ops, input problems and their texts, fault kinds, message tags, min/max round kinds.
"""
from __future__ import annotations

from .. import _C
from ..errors import (CollectiveMismatchError, CollectiveTimeoutError, FtError, InvalidInputError, MpiError, ProcFailedError,
                      ResultsDifferError, RevokedError, SilentCorruptionError,
                      UlfmUnavailableError)

StatusCode = _C.StatusCode
DType = _C.DType
ReduceOp = _C.ReduceOp
InputProblem = _C.InputProblem
FaultKind = _C.FaultKind
Tag = _C.Tag
RoundKind = _C.RoundKind

# numpy dtype names and torch dtype names (str(torch.float32) without "torch.") -> dtype code.
DTYPE_CODES: dict[str, int] = {name.lower(): int(value) for name, value in DType.__members__.items()}
# op names -> op code: "sum", "avg", "min", "max", "prod".
OPS: dict[str, int] = {name.lower(): int(value) for name, value in ReduceOp.__members__.items()}
# "kill", "exit", "hang", "stop" -> fault kind.
FAULT_KINDS: dict[str, object] = {name.lower(): value for name, value in FaultKind.__members__.items()}

_ERROR_OF_STATUS = {
    StatusCode.PROC_FAILED: ProcFailedError,
    StatusCode.REVOKED: RevokedError,
    StatusCode.TIMEOUT: CollectiveTimeoutError,
    StatusCode.ULFM_UNAVAILABLE: UlfmUnavailableError,
    StatusCode.INVALID_INPUT: InvalidInputError,
    StatusCode.MPI_ERROR: MpiError,
    StatusCode.COLLECTIVE_MISMATCH: CollectiveMismatchError,
}


def op_code(op) -> int | None:
    """Code of a reduction op given by name ("sum", "avg", "min", "max", "prod", any case);
    None if unknown."""
    if isinstance(op, str):
        return OPS.get(op.lower())
    return None


def element_size(dtype_code: int) -> int:
    """Bytes per element of a dtype code."""
    return int(_C.element_size(DType(dtype_code)))


def problem_text(problem) -> str:
    """What an input problem code means, in words ("a buffer is not contiguous")."""
    return _C.input_problem_text(InputProblem(int(problem)))


def exception_from_status(code, message: str, failed_ranks, step: int) -> FtError:
    """The exception for a core status (the bindings call this for every non-OK status).

    Args:
        code: a ``StatusCode``; message: the core's text; failed_ranks: ranks of the
            communicator the call was made on; step: the collective's step id, -1 if none.
    """
    step = None if step < 0 else step
    if code == StatusCode.CORRUPTION:  # its ranks are the implicated world ranks, not failed ones
        return SilentCorruptionError(message, ranks=failed_ranks, step=step)
    if code == StatusCode.RESULTS_DIFFER:
        return ResultsDifferError(message, ranks=failed_ranks, step=step)
    cls = _ERROR_OF_STATUS.get(code, FtError)
    return cls(message, failed_ranks=failed_ranks, step=step)
