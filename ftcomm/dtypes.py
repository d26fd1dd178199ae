"""Element types and reduction ops, as codes shared with the core (csrc/collectives/dtype.h)."""
from __future__ import annotations

FLOAT32, FLOAT64, FLOAT16, BFLOAT16, INT32, INT64 = range(6)

# numpy dtype names, torch dtype names (str(torch.float32) without "torch.") -> code.
DTYPE_CODES = {
    "float32": FLOAT32,
    "float64": FLOAT64,
    "float16": FLOAT16,
    "bfloat16": BFLOAT16,
    "int32": INT32,
    "int64": INT64,
}

OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}


def op_code(op) -> int | None:
    """Code of a reduction op given by name ("sum", "avg", "min", "max", "prod"); None if unknown."""
    if isinstance(op, str):
        return OPS.get(op.lower())
    return None
