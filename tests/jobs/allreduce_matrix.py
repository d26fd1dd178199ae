"""Every dtype x op x length through ftcomm's allreduce, checked against numpy; reports failures
and a digest of each result (the test checks the digests are equal on every rank).

Usage: allreduce_matrix.py [--big]
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import DTYPES, OPS, as_float64, digest, make_buffer, mismatch, rank_input, reference, tolerance
from harness import report

comm = ftcomm.Communicator()
n, world_rank = comm.size, comm.world_rank
lengths = [0, 1, max(n - 1, 0), n + 1, 10007]
if "--big" in sys.argv:
    lengths.append(None)  # 64 MiB + 3 elements' worth, per dtype

failures, digests = [], {}
for dtype in DTYPES:
    itemsize = 2 if dtype in ("float16", "bfloat16") else (4 if dtype.endswith("32") else 8)
    for op in OPS:
        for count in lengths:
            count = (64 << 20) // itemsize + 3 if count is None else count
            buf = make_buffer(rank_input(world_rank, count, dtype, op), dtype)
            comm.allreduce(buf, op=op, chunk_bytes=(1 << 14) if count < (1 << 20) else None)
            ref = reference((rank_input(r, count, dtype, op) for r in range(n)), dtype, op)
            result = as_float64(buf)
            case = f"{dtype}/{op}/{count}"
            if mismatch(result, ref, tolerance(dtype, op)):
                bad = np.flatnonzero(result != ref)[:3].tolist()
                failures.append(f"{case}: at {bad}: got {result[bad].tolist()} want {ref[bad].tolist()}")
            digests[case] = digest(buf)

# Non-integer inputs: sums within the dtype's rounding.
for dtype, tol in [("float32", 1e-5), ("float64", 1e-12), ("float16", 5e-3), ("bfloat16", 3e-2)]:
    rng = [np.random.default_rng([99, r]).standard_normal(4099) for r in range(n)]
    buf = make_buffer(rng[world_rank], dtype)
    comm.allreduce(buf, op="sum")
    ref = np.sum([as_float64(make_buffer(x, dtype)) for x in rng], axis=0)
    if not np.allclose(as_float64(buf), ref, rtol=tol, atol=tol * n):
        failures.append(f"{dtype}/sum/normal: max error {np.abs(as_float64(buf) - ref).max()}")
    digests[f"{dtype}/sum/normal"] = digest(buf)

report(failures=failures, digests=digests, steps=comm.last_committed_step + 1)
