"""Job at 4 ranks: a wait that times out while a peer waits in another ftcomm call. Usage:

    liveness_other_call.py SECONDS

Rank 1 is late: it sleeps SECONDS (past FTCOMM_TIMEOUT) in its own code. Rank 0 waits in an
``exchange`` for a message from rank 1 and one from rank 2. Rank 2 sends its message and then,
like ranks 3, waits in a ``minmax`` round (the input validation of allgather and broadcast), which
needs rank 0 and rank 1. When rank 0's deadline passes it judges ranks 1 and 2: rank 1 is late and
is fenced; rank 2 is inside ftcomm, waiting too, and must not be. Every rank reports its
outcome: the error type, its text and the failed world ranks, or the minmax result.
"""
import sys
import time

import numpy as np

import ftcomm
from harness import report

late_s = float(sys.argv[1])
comm = ftcomm.Communicator()
me = comm.world_rank
try:
    if me == 0:
        from_1, from_2 = np.zeros(8), np.zeros(8)
        comm.exchange(recvs=[(1, from_1), (2, from_2)], tag=7)
    elif me == 1:
        time.sleep(late_s)
        comm.exchange(sends=[(0, np.ones(8))], tag=7)
    else:
        if me == 2:
            comm.exchange(sends=[(0, np.full(8, 2.0))], tag=7)
        comm.minmax([me])
    report(kind="ok")
except ftcomm.FtError as error:
    report(kind="error", type=type(error).__name__, message=str(error),
           failed_world=[comm.world_ranks[r] for r in error.failed_ranks])
