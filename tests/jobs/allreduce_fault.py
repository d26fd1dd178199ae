"""One allreduce step with a rank failing at an injected point (FTCOMM_FAULT), then the retry.

Survivors report: the error they raised, its step and failed ranks, whether their buffer was
bitwise unchanged, and whether the retry after recover() matches the reference over the
survivors. Usage: allreduce_fault.py COUNT DTYPE OP
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import as_float64, digest, make_buffer, mismatch, rank_input, reference, tolerance
from harness import report

count, dtype, op = int(sys.argv[1]), sys.argv[2], sys.argv[3]
comm = ftcomm.Communicator()
world_rank = comm.world_rank

warmup = np.ones(8, np.float32)
comm.allreduce(warmup, step=0)  # step 0 commits on every rank

values = rank_input(world_rank, count, dtype, op, seed=1)
buf = make_buffer(values, dtype)
before = digest(buf)
error = None
try:
    comm.allreduce(buf, op=op, step=1, chunk_bytes=4096)
except ftcomm.FtError as exc:
    error = {"type": type(exc).__name__, "step": exc.step, "failed_ranks": exc.failed_ranks,
             "unchanged": digest(buf) == before}
    comm = comm.recover()
    comm.allreduce(buf, op=op, step=1, chunk_bytes=4096)  # the retry over the survivors

ref = reference([rank_input(r, count, dtype, op, seed=1) for r in comm.world_ranks], dtype, op)
replay_digest = digest(buf)
comm.allreduce(buf, op=op, step=1)  # a replay of a committed step: a no-op
report(error=error, size=comm.size, correct=not mismatch(as_float64(buf), ref, tolerance(dtype, op)),
       digest=digest(buf), replay_noop=digest(buf) == replay_digest, last_committed=comm.last_committed_step)
