"""One reduce-scatter step with a rank failing at an injected point (FTCOMM_FAULT), then the retry.

Survivors report: the error they raised, its step and failed ranks, whether input and output were
bitwise unchanged, and whether the retry after recover() (over the survivors, so with larger
segments) matches the numpy reference. Usage: reduce_scatter_fault.py COUNT DTYPE OP, COUNT a
multiple of both world sizes.
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import as_float64, digest, make_buffer, mismatch, rank_input, reference, tolerance
from harness import report

count, dtype, op = int(sys.argv[1]), sys.argv[2], sys.argv[3]
comm = ftcomm.Communicator()
world_rank = comm.world_rank

comm.allreduce(np.ones(8, np.float32), step=0)  # step 0 commits on every rank

src = make_buffer(rank_input(world_rank, count, dtype, op, seed=3), dtype)
out = make_buffer(np.full(count // comm.size, 5), dtype)
before = (digest(src), digest(out))
error = None
try:
    comm.reduce_scatter(src, out, op=op, step=1, chunk_bytes=4096)
except ftcomm.FtError as exc:
    error = {"type": type(exc).__name__, "step": exc.step, "failed_ranks": exc.failed_ranks,
             "unchanged": (digest(src), digest(out)) == before}
    comm = comm.recover()
    out = make_buffer(np.full(count // comm.size, 5), dtype)
    comm.reduce_scatter(src, out, op=op, step=1, chunk_bytes=4096)  # the retry over the survivors

whole = reference([rank_input(r, count, dtype, op, seed=3) for r in comm.world_ranks], dtype, op)
m = count // comm.size
mine = whole[comm.rank * m:(comm.rank + 1) * m]
report(error=error, size=comm.size, correct=not mismatch(as_float64(out), mine, tolerance(dtype, op)),
       input_kept=digest(src) == before[0], last_committed=comm.last_committed_step)
