"""Job for spares at the communicator level: committed allreduce steps 1..STEPS, rank r
contributing (r + 1) * step, so a full world of n ranks sums to n (n + 1) / 2 * step whoever holds
each rank. After a failure: recover(policy=POLICY) and redo the step; a promoted newcomer starts
at the interrupted step (its ledger says which). Victims come from FTCOMM_FAULT.

Usage: spares_allreduce.py POLICY STEPS
"""
import sys

import numpy as np

import ftcomm
from harness import report

policy, steps = sys.argv[1], int(sys.argv[2])
comm = ftcomm.world(timeout=30)
joined_at = comm.last_committed_step + 1
results, recoveries = {}, []
step = joined_at
while step <= steps:
    buf = np.full(1001, (comm.rank + 1) * step, np.float64)
    try:
        comm.allreduce(buf, step=step, timeout=30)
    except (ftcomm.ProcFailedError, ftcomm.RevokedError):
        comm = comm.recover(timeout=30, policy=policy)
        recoveries.append(comm.recovery.as_dict())
        continue
    assert np.all(buf == buf[0]), "allreduce result not uniform"
    results[step] = float(buf[0])
    step += 1
report(rank=comm.rank, size=comm.size, promoted=comm.promoted, joined_at=joined_at, results=results,
       recoveries=recoveries, world_ranks=comm.world_ranks)
