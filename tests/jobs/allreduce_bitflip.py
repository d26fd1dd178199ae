"""One allreduce step with a bit flipped in a ring chunk on arrival (FTCOMM_FAULT kind=bitflip:
silent corruption in transit) or in a rank's result before the commit (point=result), then the
redo on the same communicator.

Usage: allreduce_bitflip.py COUNT DTYPE OP GUARD, GUARD one of off, checksums, fingerprints. Every rank reports the error it raised
(type, step, implicated ranks, whether its buffer was bitwise unchanged) and whether the result
it ended with matches the numpy reference.
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import as_float64, digest, make_buffer, mismatch, rank_input, reference, tolerance
from harness import report

count, dtype, op = int(sys.argv[1]), sys.argv[2], sys.argv[3]
guard = {"checksums": sys.argv[4] == "checksums", "fingerprints": sys.argv[4] == "fingerprints"}
comm = ftcomm.Communicator()
comm.allreduce(np.ones(8, np.float32), step=0, **guard)

buf = make_buffer(rank_input(comm.world_rank, count, dtype, op, seed=5), dtype)
tail = np.full(3, comm.world_rank + 1.0)  # a second buffer in the bucket: its ring runs after the flipped one
bucket = [buf, tail]
before = digest(buf)
error = None
try:
    comm.allreduce(bucket, op=op, step=1, chunk_bytes=4096, **guard)
except ftcomm.SilentCorruptionError as exc:
    error = {"type": type(exc).__name__, "step": exc.step, "ranks": exc.ranks, "failed_ranks": exc.failed_ranks,
             "unchanged": digest(buf) == before, "names_ranks": f"world rank {exc.ranks[-1]}" in str(exc), "message": str(exc)}
    comm.allreduce(bucket, op=op, step=1, chunk_bytes=4096, **guard)  # the redo: the flip was transient
ref = reference([rank_input(r, count, dtype, op, seed=5) for r in comm.world_ranks], dtype, op)
tail_ref = reference([np.full(3, r + 1.0) for r in comm.world_ranks], "float64", op)
report(error=error, correct=not mismatch(as_float64(buf), ref, tolerance(dtype, op)) and not mismatch(tail, tail_ref, 0),
       digest=digest(buf),
       last_committed=comm.last_committed_step, size=comm.size)
