"""Job: allreduce steps 0..LIVENESS_STEPS-1 (default 5) at N ranks with one rank misbehaving
before step STEP, to check what the others see. Rank w contributes (w + 1) x (step + 1). Every
rank reports each committed sum and, for a failed call, the error type, its text, the failed
world ranks and how long the call took (seconds). Usage:

    liveness_cases.py CASE RANK STEP [SECONDS]

CASE: ``busy`` (RANK computes pure Python for SECONDS before STEP: slow, not dead), ``stop``
(RANK SIGSTOPs itself before STEP), ``skip`` (RANK skips the allreduce of STEP: a forgotten
collective), ``late`` (RANK sleeps SECONDS before STEP, past the timeout). The allreduce timeout
is FTCOMM_TIMEOUT, or COMM_TIMEOUT when set (the communicator's own: ``Communicator(timeout=)``).
After a failure the survivors recover and redo the step.
"""
import os
import signal
import sys
import time

import numpy as np

import ftcomm
from harness import report

case, culprit, at_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
steps = int(os.environ.get("LIVENESS_STEPS", "5"))

comm = ftcomm.Communicator(timeout=float(os.environ["COMM_TIMEOUT"]) if "COMM_TIMEOUT" in os.environ else None)
me = comm.world_rank
iteration = 0
while iteration < steps:
    if me == culprit and iteration == at_step:
        if case == "busy":
            end, x = time.monotonic() + seconds, 0
            while time.monotonic() < end:  # the GIL held, no ftcomm call, no sleep
                x = (x * 1103515245 + 12345) % 2**31
        elif case == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif case == "late":
            time.sleep(seconds)
        elif case == "skip":  # this rank's later calls are one step behind the others'
            iteration += 1
            continue
    step = comm.last_committed_step + 1  # the step id the ledger gives this call
    buf = np.full(1000, float(me + 1) * (step + 1), np.float64)
    t0 = time.monotonic()
    try:
        comm.allreduce(buf)
    except ftcomm.FtError as error:
        report(kind="error", step=step, type=type(error).__name__, message=str(error),
               failed_world=[comm.world_ranks[r] for r in error.failed_ranks], seconds=time.monotonic() - t0)
        if isinstance(error, (ftcomm.CollectiveTimeoutError, ftcomm.InvalidInputError)):
            break
        comm = comm.recover()
        continue
    report(kind="commit", step=step, sum=float(buf[0]), members=comm.world_ranks, seconds=time.monotonic() - t0)
    iteration += 1
report(kind="done", size=comm.size, members=comm.world_ranks)
