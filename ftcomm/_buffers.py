"""Turns user buffers (numpy arrays, torch tensors) into what the core takes: (address, element
count, dtype code) triples. A buffer the core cannot take is not an exception here: it becomes an
"input problem" code that the rank still brings to the collective, so that every rank raises the
same InvalidInputError instead of the others waiting for it (see csrc/collectives/allreduce_step.h).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dtypes import DTYPE_CODES

# Mirrors ftcomm::InputProblem.
NONE, NOT_CONTIGUOUS, READ_ONLY, UNSUPPORTED_DTYPE, UNSUPPORTED_OP, NOT_A_BUFFER, MIXED_DEVICES = range(7)

_PROBLEM_TEXT = {
    NOT_CONTIGUOUS: "is not contiguous",
    READ_ONLY: "is read-only",
    UNSUPPORTED_DTYPE: "has an unsupported dtype (use float32, float64, float16, bfloat16, int32 or int64)",
    NOT_A_BUFFER: "is not a numpy array or torch tensor",
    MIXED_DEVICES: "is on a device this build cannot reduce",
}


@dataclass
class HostBuffers:
    triples: list = field(default_factory=list)  # (address, count, dtype code)
    problem: int = NONE
    detail: str = ""
    keepalive: list = field(default_factory=list)
    # Issue #6: None for host buffers; else the CUDA device ordinal of device buffers (-1 for the
    # host-memory stand-ins of tests), and `triples` then holds (address, count, dtype, stream).
    device: int | None = None


def _torch_tensor_type():
    import sys

    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def _describe_numpy(arr: np.ndarray):
    code = DTYPE_CODES.get(arr.dtype.name)
    if code is None:
        return None, UNSUPPORTED_DTYPE
    if not arr.flags.c_contiguous:
        return None, NOT_CONTIGUOUS
    if not arr.flags.writeable:
        return None, READ_ONLY
    return (arr.ctypes.data, arr.size, code), NONE


def _describe_torch(t):
    if t.device.type != "cpu":
        return None, MIXED_DEVICES
    code = DTYPE_CODES.get(str(t.dtype).replace("torch.", ""))
    if code is None:
        return None, UNSUPPORTED_DTYPE
    if not t.is_contiguous():
        return None, NOT_CONTIGUOUS
    return (t.data_ptr(), t.numel(), code), NONE


def describe(buffers) -> HostBuffers:
    """Describes one buffer or a list/tuple of buffers (a bucket reduced as one step)."""
    items = list(buffers) if isinstance(buffers, (list, tuple)) else [buffers]
    out = HostBuffers()
    tensor_type = _torch_tensor_type()
    if any(_is_device_buffer(item) for item in items):  # issue #6: CUDA tensors, CuPy arrays
        return _describe_device_bucket(items)
    for i, item in enumerate(items):
        if isinstance(item, np.ndarray):
            triple, problem = _describe_numpy(item)
        elif tensor_type is not None and isinstance(item, tensor_type):
            triple, problem = _describe_torch(item)
        else:
            triple, problem = None, NOT_A_BUFFER
        if problem != NONE:
            out.problem = problem
            out.detail = f"buffer {i} ({type(item).__name__}) {_PROBLEM_TEXT[problem]}"
            out.triples = []
            return out
        out.triples.append(triple)
        out.keepalive.append(item)
    return out


# -- issue #6: device buffers (ftcomm/cuda.py owns the CUDA specifics) ----------------------------
def _is_device_buffer(item) -> bool:
    if isinstance(item, np.ndarray):
        return False
    from . import cuda

    return cuda.is_device_buffer(item)


def _describe_device_bucket(items) -> HostBuffers:
    """A bucket with at least one device buffer: every buffer must be a usable device buffer on the
    same device, else the whole step gets MIXED_DEVICES (or the buffer's own problem)."""
    from . import cuda

    out = HostBuffers()
    for i, item in enumerate(items):
        if not _is_device_buffer(item):
            problem, text = MIXED_DEVICES, "is host memory while other buffers of the step are on a CUDA device"
        else:
            info, why = cuda.describe_device(item)
            if info is not None and out.device is not None and info.device != out.device:
                problem, text = MIXED_DEVICES, f"is on cuda:{info.device}, buffer 0 on cuda:{out.device}"
            elif info is not None:
                out.device = info.device
                out.triples.append(info.quad())
                out.keepalive.append(item)
                continue
            else:
                problem, text = why
        out.problem = problem
        out.detail = f"buffer {i} ({type(item).__name__}) {text}"
        out.triples, out.device = [], None
        return out
    return out


def raw(buf, writable: bool):
    """(address, nbytes) of a contiguous numpy array or CPU torch tensor, for point-to-point.
    Point-to-point moves bytes, so any dtype will do, and a buffer that is only sent may be
    read-only.

    Raises:
        InvalidInputError: the buffer is not contiguous host memory (or not writable when
            ``writable``). Point-to-point calls are local, so this is raised on this rank only.
    """
    from .errors import InvalidInputError

    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise InvalidInputError("buffer must be contiguous")
        if writable and not buf.flags.writeable:
            raise InvalidInputError("receive buffer is read-only")
        return buf.ctypes.data, buf.nbytes
    if _is_device_buffer(buf):  # issue #6
        raise InvalidInputError("point-to-point calls take host buffers, not CUDA device buffers")
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(buf, tensor_type):
        if not buf.is_contiguous():
            raise InvalidInputError("buffer must be contiguous")
        return buf.data_ptr(), buf.numel() * buf.element_size()
    raise InvalidInputError(f"buffer ({type(buf).__name__}) {_PROBLEM_TEXT[NOT_A_BUFFER]}")
