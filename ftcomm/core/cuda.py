"""GPU buffers: CUDA availability, CUDA reduction kernels, and the staged allreduce of device
buffers (torch CUDA tensors, CuPy arrays, any object with ``__cuda_array_interface__``).

``Communicator.allreduce`` routes device buffers here by itself; most users only need
``cuda_available()`` and ``cuda_status()`` (both also at ``ftcomm.``). ``ftcomm.cuda`` is this
module. Design and limits: docs/GPU.md.

The allreduce of device buffers stages through page-locked host memory (the PyPI Open MPI has no
CUDA support): device -> pinned host copy on the producer's current stream, the host commit
protocol on that copy, and host -> device only on commit. On abort, invalid input or replay the
device buffers are never written.
"""
from __future__ import annotations

import sys
import weakref

import numpy as np

from .. import _C, settings
from .codes import DTYPE_CODES, InputProblem, element_size, op_code, problem_text

# Host-memory stand-ins for tests (see _use_host_memory_for_tests).
_host_memory_for_tests = False
_available: bool | None = None

# __cuda_array_interface__ typestr (without the byte-order character) -> dtype code.
_TYPESTR_CODES = {"f4": DTYPE_CODES["float32"], "f8": DTYPE_CODES["float64"], "f2": DTYPE_CODES["float16"],
                  "i4": DTYPE_CODES["int32"], "i8": DTYPE_CODES["int64"]}


# -- status ---------------------------------------------------------------------------------
def cuda_compiled_in() -> bool:
    """True if this build of ftcomm compiled its CUDA code (nvcc was found, FTCOMM_CUDA != 0)."""
    return bool(_C.cuda_compiled_in())


def cuda_available() -> bool:
    """True when device buffers can be reduced: CUDA compiled in, a driver loaded and at least one
    device visible. Checked once per process (the answer cannot change within it)."""
    global _available
    if _available is None:
        _available = bool(_C.cuda_status()[0])
    return _available


def cuda_status() -> str:
    """Why ``cuda_available()`` says what it says, in words: the number of devices, or the reason
    CUDA is off ("ftcomm was built without CUDA (nvcc not found)...", "no CUDA driver found ..."),
    then which data plane moves a torch process group's tensors (``data_plane_status``)."""
    ok, reason = _C.cuda_status()
    if ok:
        runtime, driver = _C.cuda_versions()
        reason = f"{reason}; CUDA runtime {_version(runtime)}, driver {_version(driver)}"
    return f"{reason}; {data_plane_status(ok)}"


def data_plane_status(cuda: bool | None = None) -> str:
    """Which data plane the torch backend's collectives take, and why, in words
    (``FTCOMM_DATA_PLANE``, docs/GPU.md): a resilient step's gradient buckets go through ftcomm's
    ring, an inner gloo group, or (CUDA tensors) an inner NCCL group where torch has NCCL and a
    device; the ring whenever the transit guard is on (and the result fingerprints, on the ring
    plane; the other planes compare them in the step's agreement). Every other collective goes
    through ftcomm's ring, CUDA tensors staged through page-locked host memory (Open MPI's
    fault-tolerant transports take no device memory). The CUDA part is said when ``cuda`` (default
    ``cuda_available()``) or under "nccl"."""
    name = settings.data_plane()
    setting = f"FTCOMM_DATA_PLANE={name}"
    host_plane = "an inner gloo group" if name == "gloo" else "ftcomm's ring"
    if not settings.buckets_on_data_plane():
        why = ("the corruption guard (FTCOMM_CHECKSUMS, or FTCOMM_FINGERPRINTS on the ring plane) needs the "
               "ring's own agreements" if settings.step_commit()
               else "FTCOMM_STEP_COMMIT=0 commits each bucket on its own")
        instead = "" if name == "ring" else f", not the {setting} plane"
        buckets = f"gradient buckets go through ftcomm's ring, each committed on its own{instead}: {why}"
        device_plane = None
    else:
        device_plane = {"ring": "are staged through page-locked host memory to ftcomm's ring",
                        "gloo": "go through the inner gloo group as they are (gloo copies them through host memory)",
                        "nccl": _nccl_words()}[name]
        buckets = f"gradient buckets on host tensors go through {host_plane} ({setting})"
        if settings.fingerprints():
            buckets += (", their result fingerprints compared in the step's agreement (FTCOMM_FINGERPRINTS=1; "
                        "no transit checksums)")
    parts = [f"data plane: a resilient step's {buckets}"]
    if device_plane and ((cuda_available() if cuda is None else cuda) or name == "nccl"):
        parts.append(f"on CUDA tensors they {device_plane}")
    parts.append(f"ZeRO's parameter allgather goes through {host_plane}")
    parts.append("other collectives go through ftcomm's ring (CUDA tensors staged through page-locked host memory)")
    return "; ".join(parts)


def _nccl_words() -> str:
    """Where CUDA buckets go under FTCOMM_DATA_PLANE=nccl, and why."""
    problem = torch_nccl_problem()
    if problem:
        return f"are staged through page-locked host memory to ftcomm's ring: {problem}"
    return "go through an inner NCCL group, in device memory"


def torch_nccl_problem() -> str | None:
    """Why the torch backend cannot use an inner NCCL group in this process, in words; None when
    it can (torch has NCCL and sees a CUDA device)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed"
    if not dist.is_available() or not dist.is_nccl_available():
        return f"this torch ({torch.__version__}) is built without NCCL"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def cuda_aware_mpi() -> bool | None:
    """Whether the MPI library can take device pointers (Open MPI's MPIX_Query_cuda_support);
    None when the MPI cannot say. ftcomm stages through host memory either way (docs/GPU.md)."""
    value = _C.cuda_aware_mpi()
    return None if value < 0 else bool(value)


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "unknown"


def _use_host_memory_for_tests(enabled: bool = True) -> None:
    """Test hook: treat objects with ``__cuda_array_interface__`` whose memory is really host
    memory as device buffers, and stage them with memcpy instead of CUDA copies. Lets the staging
    and commit logic run on machines without a GPU. Never use it with real device memory."""
    global _host_memory_for_tests
    _host_memory_for_tests = bool(enabled)


def usable() -> bool:
    """True when device buffers can be described and staged here (CUDA available, or the tests'
    host-memory stand-ins switched on)."""
    return _host_memory_for_tests or cuda_available()


# -- describing device buffers ---------------------------------------------------------------
class DeviceInfo:
    """One device buffer as the core takes it: address, element count, dtype code, the stream the
    copies are ordered on (int cudaStream_t; 0 = legacy default stream) and the device ordinal
    (-1: host memory standing in for a device, in tests)."""

    __slots__ = ("address", "count", "dtype", "stream", "device")

    def __init__(self, address, count, dtype, stream, device):
        self.address, self.count, self.dtype, self.stream, self.device = address, count, dtype, stream, device

    def quad(self):
        return (self.address, self.count, self.dtype, self.stream)


def is_device_buffer(obj) -> bool:
    """True for a torch CUDA tensor, a DeviceArray, or any object exposing
    ``__cuda_array_interface__`` (CuPy, Numba, ...)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.device.type == "cuda"
    return isinstance(obj, DeviceArray) or hasattr(obj, "__cuda_array_interface__")


def describe_device(obj):
    """(DeviceInfo, None) for a usable device buffer, else (None, the ``InputProblem``). A CUDA
    buffer in a process where CUDA is unavailable is MIXED_DEVICES (``cuda_status()`` says why)."""
    if not usable():
        return None, InputProblem.MIXED_DEVICES
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        code = DTYPE_CODES.get(str(obj.dtype).replace("torch.", ""))
        if code is None:
            return None, InputProblem.UNSUPPORTED_DTYPE
        if not obj.is_contiguous():
            return None, InputProblem.NOT_CONTIGUOUS
        device = obj.device.index if obj.device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(device).cuda_stream
        return DeviceInfo(obj.data_ptr(), obj.numel(), code, stream, device), None
    if isinstance(obj, DeviceArray):
        return DeviceInfo(obj.address, obj.size, obj.dtype_code, 0, obj.device), None
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001 - a producer may raise anything here
        return None, InputProblem.NOT_A_BUFFER
    code = _TYPESTR_CODES.get(str(cai.get("typestr", ""))[1:]) if str(cai.get("typestr", ""))[:1] in "<=|" else None
    if code is None:
        return None, InputProblem.UNSUPPORTED_DTYPE
    shape = tuple(int(d) for d in cai["shape"])
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if not _c_contiguous(shape, cai.get("strides"), element_size(code)):
        return None, InputProblem.NOT_CONTIGUOUS
    address, readonly = cai["data"]
    if readonly:
        return None, InputProblem.READ_ONLY
    address = int(address or 0)
    if _host_memory_for_tests:
        device = -1
    elif address == 0:
        device = _C.cuda_get_device()  # an empty array has no memory to ask about
    else:
        device = _C.cuda_pointer_device(address)
        if device < 0:
            return None, InputProblem.MIXED_DEVICES  # has the interface, but host memory
    stream = _cai_stream(obj, cai, device)
    return DeviceInfo(address, count, code, stream, device), None


def _c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _cai_stream(obj, cai, device) -> int:
    """The stream to order our copies after: CuPy's current stream for a CuPy array, else the
    producer's stream from the interface (v3 "stream"; None or absent: the legacy default)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray) and device >= 0:
        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)
    stream = cai.get("stream")
    return 0 if stream is None else int(stream)


# -- the staged allreduce (called by Communicator.allreduce) ---------------------------------
last_stats: dict = {}


def staged_allreduce(core, described, op: int, step: int, timeout: float, chunk_bytes: int,
                     problem: int, checksums: bool = False, fingerprints: bool = False) -> bool:
    """Runs one staged allreduce step over the core communicator ``core`` for the device bucket
    ``described`` (``buffers.describe``); returns True if it was a replay. ``checksums`` and
    ``fingerprints``: the corruption guard, on the pinned host copy. Raises the ftcomm error of
    the step (InvalidInputError, ProcFailedError, SilentCorruptionError, ...), the device buffers
    untouched."""
    replayed, copy_in, step_s, copy_out = _C.cuda_allreduce(
        core, described.triples, described.device, op, step, timeout, chunk_bytes, problem,
        checksums=checksums, fingerprints=fingerprints, host_memory_ops=_host_memory_for_tests)
    last_stats.update(copy_in_s=copy_in, step_s=step_s, copy_out_s=copy_out)
    return bool(replayed)


# -- kernels ---------------------------------------------------------------------------------
def reduce_(src, dst, op: str = "sum") -> None:
    """``dst[i] = op(src[i], dst[i])`` on the GPU, enqueued on ``dst``'s current stream (torch:
    ``torch.cuda.current_stream()``; CuPy: ``cupy.cuda.get_current_stream()``): asynchronous, like
    a torch in-place op.

    Args:
        src, dst: device buffers on the same device, same dtype (float32, float64, float16,
            bfloat16, int32, int64) and element count, contiguous; ``dst`` writable. Any length,
            any alignment.
        op: "sum", "min", "max", "prod"; "avg" sums (the reduction step of an average; divide
            with ``scale_``). float16/bfloat16 compute in float32 and round to nearest even;
            min/max propagate NaN; integers wrap.

    Raises:
        ValueError: mismatched or unsupported buffers or op.
        RuntimeError: CUDA is unavailable, or the launch failed (message names the CUDA error).
    """
    code = op_code(op)
    if code is None:
        raise ValueError(f"unknown op {op!r}")
    s, d = _kernel_operand(src, "src"), _kernel_operand(dst, "dst")
    if (s.dtype, s.count) != (d.dtype, d.count):
        raise ValueError(f"src and dst differ: dtype codes {s.dtype}/{d.dtype}, lengths {s.count}/{d.count}")
    if s.device != d.device:
        raise ValueError(f"src is on cuda:{s.device} and dst on cuda:{d.device}")
    with _on_device(d.device):
        _C.cuda_reduce(d.dtype, code, s.address, d.address, d.count, d.stream)


def scale_(buf, divisor: int) -> None:
    """``buf[i] /= divisor`` on the GPU, on ``buf``'s current stream (integers truncate toward zero).

    Raises:
        ValueError: ``divisor`` is not a positive int, or ``buf`` is not a usable device buffer.
        RuntimeError: CUDA is unavailable, or the launch failed.
    """
    if int(divisor) <= 0:
        raise ValueError("divisor must be a positive int")
    b = _kernel_operand(buf, "buf")
    with _on_device(b.device):
        _C.cuda_scale(b.dtype, b.address, b.count, int(divisor), b.stream)


def _kernel_operand(obj, name) -> DeviceInfo:
    if not cuda_available():
        raise RuntimeError(f"CUDA is unavailable: {cuda_status()}")
    if not is_device_buffer(obj):
        raise ValueError(f"{name} is not a device buffer ({type(obj).__name__})")
    info, problem = describe_device(obj)
    if info is None:
        raise ValueError(f"{name}: {problem_text(problem)}")
    return info


class _on_device:
    def __init__(self, device: int):
        self.device, self.previous = device, None

    def __enter__(self):
        if self.device >= 0:
            self.previous = _C.cuda_get_device()
            if self.previous != self.device:
                _C.cuda_set_device(self.device)

    def __exit__(self, *exc):
        if self.previous is not None and self.previous != self.device:
            _C.cuda_set_device(self.previous)


# -- a minimal device array ------------------------------------------------------------------
class DeviceArray:
    """A 1-D array in CUDA device memory (cudaMalloc), for tests, benchmarks and users without
    torch or CuPy. Exposes ``__cuda_array_interface__`` (bfloat16 appears there as "<u2", its bits).

    Args:
        count: number of elements.
        dtype: "float32", "float64", "float16", "bfloat16", "int32" or "int64".
        device: CUDA device ordinal; default the current device.

    Raises:
        RuntimeError: CUDA is unavailable or the allocation failed.
    """

    _NUMPY = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
              "bfloat16": np.uint16, "int32": np.int32, "int64": np.int64}

    def __init__(self, count: int, dtype: str = "float32", device: int | None = None):
        if dtype not in self._NUMPY:
            raise ValueError(f"unsupported dtype {dtype!r}")
        if not cuda_available():
            raise RuntimeError(f"CUDA is unavailable: {cuda_status()}")
        self.size = int(count)
        self.dtype = dtype
        self.dtype_code = DTYPE_CODES[dtype]
        self.itemsize = element_size(self.dtype_code)
        self.device = _C.cuda_get_device() if device is None else int(device)
        with _on_device(self.device):
            self.address = _C.cuda_malloc(self.size * self.itemsize)
        self._finalizer = weakref.finalize(self, _free, self.address)

    @classmethod
    def from_numpy(cls, array, dtype: str | None = None, device: int | None = None) -> "DeviceArray":
        """A device copy of a numpy array (flattened). ``dtype`` defaults to the array's; pass
        "bfloat16" with a uint16 array of bfloat16 bits."""
        array = np.ascontiguousarray(array).reshape(-1)
        out = cls(array.size, dtype or array.dtype.name, device)
        if array.dtype != out._NUMPY[out.dtype]:
            raise ValueError(f"array dtype {array.dtype} does not hold {out.dtype}")
        with _on_device(out.device):
            _C.cuda_copy_to_device(out.address, array.ctypes.data, array.nbytes)
        return out

    def numpy(self) -> np.ndarray:
        """A host copy (synchronous; waits for all work on the device). bfloat16 comes back as
        uint16 bits."""
        out = np.empty(self.size, self._NUMPY[self.dtype])
        with _on_device(self.device):
            _C.cuda_copy_from_device(out.ctypes.data, self.address, out.nbytes)
        return out

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.size,), "typestr": np.dtype(self._NUMPY[self.dtype]).str,
                "data": (self.address, False), "version": 3, "strides": None, "stream": None}

    def __repr__(self) -> str:
        return f"<ftcomm.cuda.DeviceArray {self.size} x {self.dtype} on cuda:{self.device}>"


def _free(address: int) -> None:
    try:
        _C.cuda_free(address)
    except Exception:  # noqa: BLE001 - at interpreter exit the CUDA runtime may be gone
        pass


__all__ = ["cuda_available", "cuda_status", "cuda_compiled_in", "cuda_aware_mpi", "reduce_", "scale_",
           "DeviceArray", "is_device_buffer", "describe_device"]
