"""Job script (run under ftcomm-run) for the device-buffer allreduce.

    python device_allreduce.py MODE check      # every dtype x op x length, against the host path
    python device_allreduce.py MODE fault      # steps 0, 1, 2; FTCOMM_FAULT kills a rank in step 2

MODE: fake (host memory behind __cuda_array_interface__, CPU-only), devicearray
(ftcomm.cuda.DeviceArray), torch (CUDA tensors), cupy. Every rank uses the same GPU (device 0
unless FTCOMM_TEST_DEVICE says otherwise). Reports go through harness.report.
"""
import hashlib
import sys

import numpy as np

import ftcomm
from ftcomm import cuda
from harness import report

MODE, WHAT = sys.argv[1], sys.argv[2]
DEVICE = 0

if MODE == "fake":
    from fake_cuda import FakeCudaArray

    cuda._use_host_memory_for_tests()
if MODE == "torch":
    import torch

    torch.cuda.set_device(DEVICE)
if MODE == "cupy":
    import cupy

    cupy.cuda.Device(DEVICE).use()

DTYPES = ["float32", "float64", "float16", "int32", "int64"]
if MODE in ("torch", "devicearray"):
    DTYPES.append("bfloat16")
OPS = ["sum", "avg", "min", "max", "prod"]


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even (finite values)
    return bits.astype(np.uint16)


def host_array(values: np.ndarray, dtype: str):
    """The host twin of a device buffer, reduced by the host path for the bitwise reference."""
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(to_bf16_bits(values).view(np.int16)).view(torch.bfloat16).clone()
    return values.astype(dtype)


def host_bytes(h) -> bytes:
    if isinstance(h, np.ndarray):
        return h.tobytes()
    import torch  # a bfloat16 host twin: numpy has no bfloat16, compare the raw bytes

    return h.contiguous().view(torch.int16).numpy().tobytes()


def device_array(values: np.ndarray, dtype: str):
    if MODE == "fake":
        return FakeCudaArray(values.astype(dtype))
    if MODE == "devicearray":
        if dtype == "bfloat16":
            return cuda.DeviceArray.from_numpy(to_bf16_bits(values), "bfloat16", DEVICE)
        return cuda.DeviceArray.from_numpy(values.astype(dtype), device=DEVICE)
    if MODE == "torch":
        h = host_array(values, dtype)
        return (h if dtype == "bfloat16" else torch.from_numpy(h)).to(f"cuda:{DEVICE}")
    if MODE == "cupy":
        return cupy.asarray(values.astype(dtype))
    raise SystemExit(f"unknown mode {MODE}")


def device_bytes(d) -> bytes:
    if MODE in ("fake", "devicearray"):
        return d.numpy().tobytes()
    if MODE == "torch":
        return d.cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return cupy.asnumpy(d).tobytes()


def data(n, count, op, seed):
    rng = np.random.default_rng(seed)
    if op == "prod":
        return rng.integers(1, 3, size=(n, count)).astype(np.float64)
    return rng.integers(-3, 4, size=(n, count)).astype(np.float64)


def check(comm):
    r, n = comm.rank, comm.size
    mismatches = []
    steps = 0
    for count in [0, 1, n + 1, 1001, 262147]:
        for dtype in DTYPES:
            for op in OPS:
                values = data(n, count, op, count * 31 + len(dtype))
                ref = host_array(values[r], dtype)
                comm.allreduce(ref, op=op, chunk_bytes=4096)  # the host path: the reference
                dev = device_array(values[r], dtype)
                comm.allreduce(dev, op=op, chunk_bytes=4096)
                steps += 2
                if device_bytes(dev) != host_bytes(ref):
                    mismatches.append([count, dtype, op])
    # A bucket of two device buffers of different dtypes, one step.
    a, b = data(n, 5003, "sum", 1), data(n, 77, "sum", 2)
    da, db = device_array(a[r], "float32"), device_array(b[r], "int64")
    comm.allreduce([da, db], op="sum")
    bucket_ok = (device_bytes(da) == a.sum(0).astype(np.float32).tobytes()
                 and device_bytes(db) == b.sum(0).astype(np.int64).tobytes())
    # A replay of the last committed step writes nothing.
    z = device_array(np.zeros(100), "float32")
    comm.allreduce(z, op="sum", step=comm.last_committed_step)
    replay_ok = device_bytes(z) == np.zeros(100, np.float32).tobytes()
    # Host and device buffers in one step (on rank 0 only): every rank raises, nothing written.
    mixed = None
    x = device_array(np.full(10, r + 1.0), "float32")
    bucket = [x, np.ones(10, np.float32)] if r == 0 else [x, device_array(np.ones(10), "float32")]
    try:
        comm.allreduce(bucket, op="sum")
    except ftcomm.InvalidInputError as e:
        mixed = str(e)
    mixed_untouched = device_bytes(x) == np.full(10, r + 1.0, np.float32).tobytes()
    # A device buffer in a step where another rank's input is bad: untouched too.
    bad = None
    y = device_array(np.full(10, 2.0), "float32")
    try:
        comm.allreduce(y if r != n - 1 else "not a buffer", op="sum")
    except ftcomm.InvalidInputError as e:
        bad = str(e)
    bad_untouched = device_bytes(y) == np.full(10, 2.0, np.float32).tobytes()
    report(kind="check", mode=MODE, mismatches=mismatches, steps=steps, bucket_ok=bucket_ok,
           replay_ok=replay_ok, mixed=mixed, mixed_untouched=mixed_untouched, bad=bad,
           bad_untouched=bad_untouched, stats=dict(cuda.last_stats))


def fault(comm):
    count = 10007
    n0 = comm.size
    values = data(n0, count, "sum", 5)
    bufs = {}
    for step in range(3):
        buf = device_array(values[comm.rank] * (step + 1), "float32")
        before = device_bytes(buf)
        try:
            comm.allreduce(buf, op="sum", step=step, chunk_bytes=4096)
        except ftcomm.ProcFailedError as e:
            untouched = device_bytes(buf) == before
            error = {"type": type(e).__name__, "step": e.step, "failed_ranks": list(e.failed_ranks)}
            comm = comm.recover()
            comm.allreduce(buf, op="sum", step=step, chunk_bytes=4096)  # retry over the survivors
            survivors = [w for w in range(n0) if w in comm.world_ranks]
            expected = (values[survivors] * (step + 1)).sum(0).astype(np.float32)
            report(kind="fault", mode=MODE, error=error, untouched=untouched,
                   retry_ok=device_bytes(buf) == expected.tobytes(), size=comm.size,
                   digest=hashlib.sha1(device_bytes(buf)).hexdigest(), last_step=comm.last_committed_step)
            return
        bufs[step] = device_bytes(buf) == (values * (step + 1)).sum(0).astype(np.float32).tobytes()
    report(kind="fault", mode=MODE, error=None, steps_ok=bufs)


comm = ftcomm.Communicator()
report(kind="start", mode=MODE, cuda_status=cuda.cuda_status(), available=cuda.cuda_available())
if WHAT == "check":
    check(comm)
else:
    fault(comm)
