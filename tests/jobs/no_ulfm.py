"""Job (any size) for an MPI job without ULFM (MPICH, or Open MPI with --no-ft): each recovery verb
is called on every rank and must raise UlfmUnavailableError at once, before any communication;
then the communicator is still whole. Reports "verbs" ({verb: [exception class, seconds, message]}),
ft_enabled, ulfm_status, and the sum of an allreduce made after the refused verbs.

Usage: no_ulfm.py [--raise-at STEP]   (also: world rank 1 raises an uncaught exception at STEP)
"""
import argparse
import time

import numpy as np

import ftcomm
from harness import report

p = argparse.ArgumentParser()
p.add_argument("--raise-at", type=int, default=-1)
args = p.parse_args()

comm = ftcomm.Communicator()
verbs = {
    "revoke": lambda: comm.revoke(),
    "shrink": lambda: comm.shrink(timeout=30),
    "failed_ranks": lambda: comm.failed_ranks(),
    "recover": lambda: comm.recover(timeout=30),
    "recover_spares": lambda: comm.recover(timeout=30, policy="spares"),
    "shrink_to_survivors": lambda: comm.shrink_to_survivors(timeout=30),
}
outcome = {}
for name, call in verbs.items():
    start = time.perf_counter()
    try:
        call()
        outcome[name] = ["returned", time.perf_counter() - start, ""]
    except Exception as exc:  # noqa: BLE001 (the test checks which)
        outcome[name] = [type(exc).__name__, time.perf_counter() - start, str(exc)]

buf = np.full(1001, comm.world_rank + 1, np.int64)
comm.allreduce(buf, op="sum")
report(verbs=outcome, ft_enabled=ftcomm.ft_enabled(), ulfm_status=ftcomm.ulfm_status(),
       family=ftcomm.mpi_family(), sum=buf.tolist()[:3], size=comm.size, is_revoked=comm.is_revoked)

for step in range(100):
    if step == args.raise_at and comm.world_rank == 1:
        raise RuntimeError(f"bad input on world rank 1 at step {step}")
    comm.allreduce(np.ones(1000, np.float32), timeout=60)
report(event="done")
