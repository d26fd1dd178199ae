"""Job: CYCLES revoke/shrink recoveries of one communicator, no rank lost, with an allreduce on
each new communicator; reports this rank's resident memory (VmRSS, bytes) after WARMUP cycles
and at the end, and whether every allreduce summed right. Usage: recover_cycles.py CYCLES WARMUP
"""
import sys

import numpy as np

import ftcomm
from harness import report


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


cycles, warmup = int(sys.argv[1]), int(sys.argv[2])
comm = ftcomm.Communicator()
n, ok = comm.size, True
buf = np.empty(1000, np.float64)
for cycle in range(1, cycles + 1):
    comm.revoke()
    comm = comm.recover(timeout=30)
    buf.fill(comm.rank + 1)
    comm.allreduce(buf, timeout=30)
    ok &= bool(np.all(buf == n * (n + 1) / 2))
    if cycle == warmup:
        warm = rss_bytes()
report(kind="rss", warm=warm, end=rss_bytes(), cycles=cycles, warmup=warmup, sums_ok=ok, size=comm.size)
