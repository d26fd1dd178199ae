"""Job for the ULFM kill scenarios: the victims SIGKILL themselves after a first
barrier; survivors must see the failure in a barrier, shrink, agree and reduce again.

Usage: ulfm_kill.py VICTIM[,VICTIM...]
"""
import os
import signal
import sys
import time

import numpy as np

import ftcomm
from harness import report

victims = {int(v) for v in sys.argv[1].split(",")}
comm = ftcomm.Communicator()
world_rank = comm.world_rank


def die_if_victim() -> None:
    if world_rank in victims:
        os.kill(os.getpid(), signal.SIGKILL)


error = None
start = time.monotonic()
try:
    # A victim leaves this first barrier as soon as it has heard from everyone, and its last
    # message may still sit in its send queue when it dies: a survivor can see the failure here.
    comm.barrier(timeout=30)
    die_if_victim()
    start = time.monotonic()
    for _ in range(1000):  # until the failure reaches this rank
        comm.barrier(timeout=30)
        time.sleep(0.005)
except (ftcomm.ProcFailedError, ftcomm.RevokedError) as exc:
    die_if_victim()  # a victim that saw the other victim's death in the first barrier
    error = type(exc).__name__
detect_s = time.monotonic() - start
if not comm.is_revoked:
    comm.revoke()  # make sure every survivor leaves its barrier
shrunk = comm.shrink(timeout=30)

# Each survivor contributes all-ones except its own new-rank bit: the AND clears exactly the
# survivors' bits.
flag = 0xFF & ~(1 << shrunk.rank)
agreed = shrunk.agree(flag, timeout=30)

ranks = np.zeros(shrunk.size, np.int64)
shrunk.allgather(np.array([shrunk.rank], np.int64), ranks)
value = np.array([world_rank + 1], np.int64)
shrunk.allreduce(value, op="sum")
report(error=error, detect_s=detect_s, size=shrunk.size, rank=shrunk.rank, ranks=ranks.tolist(),
       agreed=agreed, sum=int(value[0]), old_to_new=shrunk.old_to_new)
