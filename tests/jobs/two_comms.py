"""Job: two communicators over the same ranks, A over MPI_COMM_WORLD and B over a duplicate of it,
allreduces alternating A, B, A, B for ROUNDS rounds; FTCOMM_FAULT kills a rank inside one of A's
allreduces. Each communicator recovers when its own call fails, and the call is redone. Ranks
enter each call a few milliseconds apart (seeded jitter), and world rank 0 enters each call on B
0.3 s late, polling MPI meanwhile: after the failure it finds B already revoked by a peer that
failed inside it. Every survivor reports each committed sum (communicator, its step, sum,
members) and the errors it saw. Usage: two_comms.py ROUNDS
"""
import random
import sys
import time

import numpy as np
from mpi4py import MPI

import ftcomm
from harness import report

rounds = int(sys.argv[1])
comms = {"A": ftcomm.Communicator(), "B": ftcomm.Communicator(MPI.COMM_WORLD.Dup())}
me = comms["A"].world_rank
jitter = random.Random(me)
for r in range(1, rounds + 1):
    for name in ("A", "B"):
        while True:
            comm = comms[name]
            step = comm.last_committed_step + 1
            buf = np.full(4099, float(me + 1) * (step + 1) * (1 if name == "A" else 10), np.float64)
            time.sleep(jitter.uniform(0, 0.05))
            if name == "B" and me == 0:
                end = time.monotonic() + 0.3
                while time.monotonic() < end:
                    MPI.COMM_SELF.Iprobe()  # drives MPI progress: a peer's revoke of B arrives here
                    time.sleep(0.005)
            try:
                comm.allreduce(buf, step=step, timeout=20)
            except (ftcomm.ProcFailedError, ftcomm.RevokedError) as error:
                report(kind="error", comm=name, step=step, type=type(error).__name__,
                       failed_world=[comm.world_ranks[f] for f in error.failed_ranks])
                comms[name] = comm.recover(timeout=20)
                continue
            report(kind="commit", comm=name, step=step, sum=float(buf[0]), members=comm.world_ranks)
            break
report(kind="done", sizes={n: c.size for n, c in comms.items()})
