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
    """Integer values as float64: in [-3, 3], or +-1/+-2 for prod (no overflow at 4 ranks)."""
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


def reference(inputs: list, dtype: str, op: str) -> np.ndarray:
    stack = np.stack(inputs)
    if op == "sum":
        return stack.sum(0)
    if op == "min":
        return stack.min(0)
    if op == "max":
        return stack.max(0)
    if op == "prod":
        return stack.prod(0)
    if dtype.startswith("int"):
        return np.trunc(stack.sum(0) / len(inputs))
    return stack.sum(0) / len(inputs)


def tolerance(dtype: str, op: str) -> float:
    """Relative tolerance: zero (exact) except for avg on floats, which divides."""
    if op != "avg" or dtype.startswith("int"):
        return 0.0
    return {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}[dtype]


def mismatch(result: np.ndarray, ref: np.ndarray, tol: float) -> bool:
    if tol == 0.0:
        return not np.array_equal(result, ref)
    return not np.allclose(result, ref, rtol=tol, atol=tol)
