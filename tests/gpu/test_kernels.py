"""CUDA reduction kernels against numpy, for every dtype x op, bitwise: each element is one IEEE
operation in the same precision on both sides (float16/bfloat16: in float32, rounded to nearest
even), so any difference is a bug. Lengths and offsets cover the scalar head, the 16-byte vector
body, the scalar tail and mutually misaligned operands (all-scalar path)."""
import numpy as np
import pytest

from gpu_env import requires_gpu, fcuda

pytestmark = [pytest.mark.gpu, requires_gpu]

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
OPS = ["sum", "avg", "min", "max", "prod"]


def bf16_bits(x):
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def sample(dtype, n, seed):
    rng = np.random.default_rng(seed)
    if dtype in ("int32", "int64"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)  # wrapping matters
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_bits(x)
    return x.astype(dtype)


def reference(dtype, op, a, b):
    """op(a, b) elementwise in the kernels' arithmetic."""
    if dtype == "bfloat16":
        return bf16_bits(reference("float32", op, bf16_float(a), bf16_float(b)))
    wide = np.float32 if dtype == "float16" else a.dtype
    x, y = a.astype(wide), b.astype(wide)
    with np.errstate(over="ignore"):
        r = {"sum": x + y, "avg": x + y, "min": np.minimum(x, y), "max": np.maximum(x, y), "prod": x * y}[op]
    return r.astype(dtype)


class View:
    """A window [offset, offset+count) of a DeviceArray, through __cuda_array_interface__."""

    def __init__(self, base, offset, count):
        self.base, self.offset, self.count = base, offset, count

    @property
    def __cuda_array_interface__(self):
        cai = dict(self.base.__cuda_array_interface__)
        cai["shape"] = (self.count,)
        cai["data"] = (self.base.address + self.offset * self.base.itemsize, False)
        return cai


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_numpy(dtype, op):
    n = (1 << 20) + 13
    a, b = sample(dtype, n, 1), sample(dtype, n, 2)
    da = fcuda.DeviceArray.from_numpy(a, dtype)
    db = fcuda.DeviceArray.from_numpy(b, dtype)
    fcuda.reduce_(da, db, op)
    got = db.numpy()
    assert np.array_equal(da.numpy(), a), "src was written"
    np.testing.assert_array_equal(got.view(np.uint8), reference(dtype, op, a, b).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_any_length_and_alignment(dtype):
    if dtype == "bfloat16":  # __cuda_array_interface__ cannot say bfloat16; covered above
        pytest.skip("bfloat16 windows are not expressible through __cuda_array_interface__")
    base_a = fcuda.DeviceArray.from_numpy(sample(dtype, 300, 3), dtype)
    for src_off, dst_off, count in [(0, 0, 0), (0, 0, 1), (1, 1, 7), (3, 3, 100), (0, 1, 129),
                                    (5, 2, 64), (7, 7, 200), (0, 0, 255)]:
        host_b = sample(dtype, 300, 4 + count)
        base_b = fcuda.DeviceArray.from_numpy(host_b, dtype)
        src, dst = View(base_a, src_off, count), View(base_b, dst_off, count)
        fcuda.reduce_(src, dst, "sum")
        expected = host_b.copy()
        a = base_a.numpy()
        expected[dst_off:dst_off + count] = reference(dtype, "sum", a[src_off:src_off + count],
                                                      host_b[dst_off:dst_off + count])
        np.testing.assert_array_equal(base_b.numpy(), expected, err_msg=f"{src_off} {dst_off} {count}")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_min_max_propagate_nan(dtype):
    x = np.array([np.nan, 1.0, 2.0, np.nan, -1.0] * 11, np.float32)
    y = np.array([0.0, np.nan, 3.0, np.nan, -2.0] * 11, np.float32)
    cast = bf16_bits if dtype == "bfloat16" else (lambda v: v.astype(dtype))
    back = bf16_float if dtype == "bfloat16" else (lambda v: v.astype(np.float64))
    for op, fn in [("min", np.minimum), ("max", np.maximum)]:
        dx, dy = fcuda.DeviceArray.from_numpy(cast(x), dtype), fcuda.DeviceArray.from_numpy(cast(y), dtype)
        fcuda.reduce_(dx, dy, op)
        got = back(dy.numpy())
        np.testing.assert_array_equal(np.isnan(got), np.isnan(fn(x, y)))
        ok = ~np.isnan(got)
        np.testing.assert_array_equal(got[ok], fn(x, y)[ok])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("divisor", [1, 3, 4])
def test_scale_for_avg(dtype, divisor):
    a = sample(dtype, 10007, 9)
    d = fcuda.DeviceArray.from_numpy(a, dtype)
    fcuda.scale_(d, divisor)
    got = d.numpy()
    if dtype in ("int32", "int64"):
        q = a // divisor  # floor; C truncates toward zero
        expected = np.where((a % divisor != 0) & (a < 0), q + 1, q).astype(dtype)
    elif dtype == "bfloat16":
        f = bf16_float(a)
        expected = bf16_bits(f * np.float32(1 / divisor) if divisor & (divisor - 1) == 0 else f / np.float32(divisor))
    else:
        wide = np.float32 if dtype == "float16" else a.dtype
        x = a.astype(wide)
        expected = (x * wide(1 / divisor) if divisor & (divisor - 1) == 0 else x / wide(divisor)).astype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def test_kernel_rejects_mismatched_operands():
    a = fcuda.DeviceArray(10, "float32")
    with pytest.raises(ValueError, match="differ"):
        fcuda.reduce_(a, fcuda.DeviceArray(11, "float32"))
    with pytest.raises(ValueError, match="differ"):
        fcuda.reduce_(a, fcuda.DeviceArray(10, "float64"))
    with pytest.raises(ValueError, match="op"):
        fcuda.reduce_(a, fcuda.DeviceArray(10, "float32"), "xor")
