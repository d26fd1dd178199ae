"""Fault-matrix job: a few allreduce steps whose results are accumulated, with ranks
failing at injected points (FTCOMM_FAULT, any kind). A failed step is redone after recover().

Every survivor reports: each error (type, step, failed world ranks, buffer unchanged, detection ms =
step start to exception), recovery ms (exception to the redo's commit), the membership at each
committed step, and whether its accumulator equals, bitwise, the reference computed from that
membership (so a step lost or applied twice shows). Usage: matrix_allreduce.py [--steps S]
"""
import argparse
import hashlib
import time

import numpy as np

import ftcomm
from harness import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--no-recover", action="store_true", help="re-raise the first error (a failed job)")
p.add_argument("--count", type=int, default=10007)  # 3 chunks per segment at 4 ranks, 4 KiB chunks
args = p.parse_args()


def inputs(step, world_rank):
    """Integer-valued float32 (sums exact in any order)."""
    return np.random.default_rng([step, world_rank]).integers(-8, 9, args.count).astype(np.float32)


comm = ftcomm.Communicator()
me = comm.world_rank
acc = np.zeros(args.count, np.float64)
members, errors, recoveries = {}, [], []
step, pending_recovery = 0, None
while step < args.steps:
    buf = inputs(step, me)
    before = buf.tobytes()
    t0 = time.perf_counter()
    try:
        comm.allreduce(buf, step=step, chunk_bytes=4096)
    except ftcomm.FtError as exc:
        t1 = time.perf_counter()
        errors.append({"type": type(exc).__name__, "step": exc.step,
                       "failed": sorted(comm.world_ranks[r] for r in exc.failed_ranks),
                       "unchanged": buf.tobytes() == before, "detection_ms": round((t1 - t0) * 1e3, 1)})
        if args.no_recover:
            raise
        pending_recovery = pending_recovery or t1
        comm = comm.recover()
        continue  # redo the same step id on the survivors
    if pending_recovery is not None:
        recoveries.append(round((time.perf_counter() - pending_recovery) * 1e3, 1))
        pending_recovery = None
    acc += buf
    members[step] = list(comm.world_ranks)
    step += 1

reference = np.zeros(args.count, np.float64)
for s, ranks in members.items():
    reference += np.sum([inputs(s, r) for r in ranks], axis=0, dtype=np.float32)
report(event="done", errors=errors, recovery_ms=recoveries, members={str(k): v for k, v in members.items()},
       size=comm.size, last_committed=comm.last_committed_step, state_ok=bool(np.array_equal(acc, reference)),
       digest=hashlib.blake2b(acc.tobytes(), digest_size=8).hexdigest(), nan_free=bool(np.isfinite(acc).all()))
