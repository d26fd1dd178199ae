"""Job (3 ranks): ``ftcomm.torch.monitored_barrier`` on the ftcomm backend.

1. "reached": world rank 2 comes 1 s late, within the 20 s timeout: nobody raises, and rank 0
   waited for it.
2. "late": world rank 2 comes 5 s late, past the 2 s timeout (``wait_all_ranks``): rank 0 raises
   CollectiveTimeoutError naming rank 2 in gloo's words, ranks 1 and 2 (never answered) raise
   CollectiveTimeoutError too; rank 2 is alive (not fenced).
3. "after": every rank meets on MPI_COMM_WORLD, then one more monitored barrier passes: the late
   token rank 2 sent in 2 (still delivered: Open MPI cannot cancel a send) is dropped, not taken
   for this barrier's.
4. "lost" (--fault kill or stop): world rank 2 is SIGKILLed or SIGSTOPped before a monitored
   barrier with a 30 s timeout. Rank 0 raises ProcFailedError naming rank 2: at once when killed,
   after FTCOMM_FENCE_TIMEOUT when stopped (it is then fenced); rank 1, never answered, raises.
   The survivors' next all_reduce recovers the group (ProcFailedError once) and the retry sums
   over the two survivors.
Reports one "phase" per phase and rank: name, error (type and text, or None), seconds.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

import ftcomm
import ftcomm.torch
from harness import report

parser = argparse.ArgumentParser()
parser.add_argument("--fault", choices=("kill", "stop"), required=True)
args = parser.parse_args()
LATE = 2

dist.init_process_group("ftcomm")
ME = dist.get_rank()


def phase(name: str, late_s: float, timeout: float, **kwargs) -> None:
    if ME == LATE:
        time.sleep(late_s)
    start, error = time.monotonic(), None
    try:
        ftcomm.torch.monitored_barrier(timeout=timeout, **kwargs)
    except ftcomm.FtError as exc:
        error = {"type": type(exc).__name__, "text": str(exc), "failed": exc.failed_ranks}
    report(kind="phase", name=name, error=error, s=round(time.monotonic() - start, 2))


phase("reached", late_s=1.0, timeout=20.0)
phase("late", late_s=5.0, timeout=2.0, wait_all_ranks=True)
MPI.COMM_WORLD.Barrier()
phase("after", late_s=0.0, timeout=20.0)
MPI.COMM_WORLD.Barrier()
if ME == LATE:
    os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
phase("lost", late_s=0.0, timeout=30.0)
errors = []
for _ in range(2):
    total = torch.ones(1)
    try:
        dist.all_reduce(total)
        break
    except ftcomm.FtError as exc:
        errors.append(type(exc).__name__)
report(kind="after_loss", errors=errors, total=total.item(), size=dist.get_world_size())
dist.destroy_process_group()
