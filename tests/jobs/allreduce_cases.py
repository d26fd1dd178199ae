"""Inputs and numpy references shared by the allreduce job scripts.

Rank inputs are integer-valued (so sums, min, max and products are exact in every dtype) and
derived from the world rank alone, so any rank can compute the reference over any set of ranks.
"""
import hashlib

import sys

import numpy as np

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
OPS = ["sum", "avg", "min", "max", "prod"]


def rank_input(world_rank: int, count: int, dtype: str, op: str, seed: int = 0) -> np.ndarray:
    """Integer values as float64: in [-3, 3], or +-1/+-2 for prod (no overflow at 4 ranks).
    Random for small counts; a cheap arithmetic pattern for large ones (the 64 MiB cases would
    otherwise spend most of the test generating random numbers)."""
    if count > (1 << 20):
        idx = np.arange(count, dtype=np.int64)
        pattern = (idx * (2 * world_rank + 3) + 5 * world_rank + seed) % 7
        if op == "prod":
            return np.array([-2.0, -1.0, 1.0, 2.0])[pattern % 4]
        return (pattern - 3).astype(np.float64)
    rng = np.random.default_rng([seed, world_rank, count])
    if op == "prod":
        return rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), size=count)
    return rng.integers(-3, 4, size=count).astype(np.float64)


def make_buffer(values: np.ndarray, dtype: str):
    """A numpy array, or a torch tensor for bfloat16 (numpy has no bfloat16)."""
    if dtype == "bfloat16":
        import torch  # only here: importing torch costs seconds per rank on a busy machine

        return torch.from_numpy(values).to(torch.bfloat16)
    return values.astype(dtype)


def _is_tensor(buf) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(buf, torch.Tensor)


def as_float64(buf) -> np.ndarray:
    if _is_tensor(buf):
        import torch

        return buf.to(torch.float64).numpy()
    return buf.astype(np.float64)


def digest(buf) -> str:
    if _is_tensor(buf):
        import torch

        raw = buf.view(torch.int16).numpy().tobytes()
    else:
        raw = buf.tobytes()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def reference(inputs, dtype: str, op: str) -> np.ndarray:
    """The reduction of ``inputs`` (an iterable of float64 arrays), folded one rank at a time so
    that large cases never hold every rank's input at once."""
    total, n = None, 0
    for x in inputs:
        n += 1
        if total is None:
            total = x.copy()
        elif op in ("sum", "avg"):
            total += x
        elif op == "min":
            np.minimum(total, x, out=total)
        elif op == "max":
            np.maximum(total, x, out=total)
        elif op == "prod":
            total *= x
    if op == "avg":
        total = np.trunc(total / n) if dtype.startswith("int") else total / n
    return total


def tolerance(dtype: str, op: str) -> float:
    """Relative tolerance: zero (exact) except for avg on floats, which divides."""
    if op != "avg" or dtype.startswith("int"):
        return 0.0
    return {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}[dtype]


def mismatch(result: np.ndarray, ref: np.ndarray, tol: float) -> bool:
    if tol == 0.0:
        return not np.array_equal(result, ref)
    return not np.allclose(result, ref, rtol=tol, atol=tol)
