"""Job: the CPU an idle spare burns. Rank 0 reads the spare's pid from ftcomm-run's
run directory and its CPU time (utime + stime in /proc/PID/stat) before and after 3 s of
waiting, and reports the fraction of one core the spare used. With "stop", rank 0 then SIGSTOPs
the spare: the job must still end by itself. Launch with --spares 1."""
import os
import signal
import sys
import time

from mpi4py import MPI

import ftcomm
from harness import report

comm = ftcomm.world(timeout=30)  # the spare stays in here until the actives leave


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields 3.. of proc(5); utime, stime: 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if comm.rank == 0:
    spare = MPI.COMM_WORLD.Get_size() - 1
    with open(os.path.join(os.environ["FTCOMM_RUN_DIR"], f"pid-rank{spare}")) as f:
        pid = int(f.read())
    time.sleep(1.0)  # past the spare's start-up
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(3.0)
    c1, t1 = cpu_seconds(pid), time.monotonic()
    report(cpu_fraction=(c1 - c0) / (t1 - t0))
    if sys.argv[1:] == ["stop"]:
        os.kill(pid, signal.SIGSTOP)  # a stuck spare at the end of the job
comm.barrier(timeout=60)
