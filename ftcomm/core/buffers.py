"""Turns user buffers (numpy arrays, torch tensors, CUDA buffers) into what the core takes:
(address, element count, dtype code) triples, or quads with a stream for device buffers.

A buffer the core cannot take is not an exception here: it becomes an input problem code
(``codes.InputProblem``) that the rank still brings to the collective, so that every rank raises
the same InvalidInputError instead of the others waiting for it (csrc/collectives/allreduce_step.h).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidInputError
from . import cuda
from .codes import DTYPE_CODES, InputProblem, problem_text

NONE = InputProblem.NONE


@dataclass
class Described:
    """A bucket of buffers as the core takes it.

    Attributes:
        triples: (address, count, dtype code) per host buffer, or (address, count, dtype code,
            stream) per device buffer.
        problem: why this rank rejects its input (``InputProblem.NONE`` if it does not).
        detail: what this rank saw ("buffer 1 (ndarray) has dtype complex64"); only it knows.
        keepalive: the buffers, referenced while the core uses their memory.
        device: None for host buffers; else the CUDA device ordinal (-1 for the host-memory
            stand-ins of tests).
    """

    triples: list = field(default_factory=list)
    problem: object = NONE
    detail: str = ""
    keepalive: list = field(default_factory=list)
    device: int | None = None


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


# numpy dtype -> code, looked up by the dtype object: ``arr.dtype.name`` builds its string on
# each call (about 8 us here, most of the Python side of a small allreduce). Other dtypes (a
# bfloat16 from ml_dtypes, say) take the name lookup.
_NUMPY_CODES = {np.dtype(name): code for name, code in DTYPE_CODES.items() if name != "bfloat16"}


def _describe_numpy(arr: np.ndarray, writable: bool = True):
    code = _NUMPY_CODES.get(arr.dtype)
    if code is None and arr.dtype.isnative:  # not a byte-swapped '>f4': the core reduces native values
        code = DTYPE_CODES.get(arr.dtype.name)
    if code is None:
        return None, InputProblem.UNSUPPORTED_DTYPE
    if not arr.flags.c_contiguous:
        return None, InputProblem.NOT_CONTIGUOUS
    if writable and not arr.flags.writeable:
        return None, InputProblem.READ_ONLY
    return (arr.ctypes.data, arr.size, code), NONE


def _describe_torch(t):
    if t.device.type != "cpu":
        return None, InputProblem.MIXED_DEVICES
    code = DTYPE_CODES.get(str(t.dtype).replace("torch.", ""))
    if code is None:
        return None, InputProblem.UNSUPPORTED_DTYPE
    if not t.is_contiguous():
        return None, InputProblem.NOT_CONTIGUOUS
    return (t.data_ptr(), t.numel(), code), NONE


def _rejected(index: int, item, problem, why: str) -> Described:
    return Described(problem=problem, detail=f"buffer {index} ({type(item).__name__}) {why}")


def _is_device_buffer(item) -> bool:
    return not isinstance(item, np.ndarray) and cuda.is_device_buffer(item)


def describe(buffers, writable: bool = True) -> Described:
    """Describes one buffer or a list/tuple of buffers (a bucket reduced as one step). A bucket
    with any device buffer is described as a device bucket (``describe_device_bucket``).
    ``writable=False``: buffers only read (a reduce-scatter's input) may be read-only."""
    items = list(buffers) if isinstance(buffers, (list, tuple)) else [buffers]
    if any(_is_device_buffer(item) for item in items):
        return describe_device_bucket(items)
    out = Described()
    tensor_type = _torch_tensor_type()
    for index, item in enumerate(items):
        if isinstance(item, np.ndarray):
            triple, problem = _describe_numpy(item, writable)
        elif tensor_type is not None and isinstance(item, tensor_type):
            triple, problem = _describe_torch(item)
        else:
            triple, problem = None, InputProblem.NOT_A_BUFFER
        if problem != NONE:
            return _rejected(index, item, problem, _what_is_wrong(item, problem))
        out.triples.append(triple)
        out.keepalive.append(item)
    return out


def describe_device_bucket(items) -> Described:
    """A bucket with at least one device buffer: every buffer must be a usable device buffer on
    the same device, else the whole step gets MIXED_DEVICES (or the buffer's own problem)."""
    out = Described()
    for index, item in enumerate(items):
        if not _is_device_buffer(item):
            return _rejected(index, item, InputProblem.MIXED_DEVICES,
                             "is host memory, while other buffers of the step are on a CUDA device")
        info, problem = cuda.describe_device(item)
        if info is None:
            why = f"is a CUDA buffer and CUDA is unavailable: {cuda.cuda_status()}" if not cuda.usable() else \
                _what_is_wrong(item, problem)
            return _rejected(index, item, problem, why)
        if out.device is not None and info.device != out.device:
            return _rejected(index, item, InputProblem.MIXED_DEVICES,
                             f"is on cuda:{info.device}, while buffer 0 is on cuda:{out.device}")
        out.device = info.device
        out.triples.append(info.quad())
        out.keepalive.append(item)
    return out


def _what_is_wrong(item, problem) -> str:
    if problem == InputProblem.UNSUPPORTED_DTYPE:
        return f"has dtype {str(getattr(item, 'dtype', '?')).replace('torch.', '')}"
    if problem == InputProblem.MIXED_DEVICES:
        return f"is on {getattr(item, 'device', 'a device')}"
    return {InputProblem.NOT_CONTIGUOUS: "is not contiguous", InputProblem.READ_ONLY: "is read-only",
            InputProblem.NOT_A_BUFFER: "is not an array or tensor"}.get(problem, problem_text(problem))


def raw(buf, writable: bool):
    """(address, nbytes) of a contiguous numpy array or CPU torch tensor, for point-to-point.
    Point-to-point moves bytes, so any dtype will do, and a buffer that is only sent may be
    read-only.

    Raises:
        InvalidInputError: the buffer is not contiguous host memory (or not writable when
            ``writable``). Point-to-point calls are local, so this is raised on this rank only.
    """
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise InvalidInputError(problem_text(InputProblem.NOT_CONTIGUOUS))
        if writable and not buf.flags.writeable:
            raise InvalidInputError(problem_text(InputProblem.READ_ONLY) + " (a receive buffer)")
        return buf.ctypes.data, buf.nbytes
    if _is_device_buffer(buf):
        raise InvalidInputError("point-to-point calls take host buffers, not CUDA device buffers")
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(buf, tensor_type):
        if not buf.is_contiguous():
            raise InvalidInputError(problem_text(InputProblem.NOT_CONTIGUOUS))
        return buf.data_ptr(), buf.numel() * buf.element_size()
    raise InvalidInputError(f"{problem_text(InputProblem.NOT_A_BUFFER)} ({type(buf).__name__})")
