"""Job for tests/integration/test_slurm.py: `ftcomm-run --restarts 1` inside a Slurm allocation.
Every rank first reports "start": the launch number (FTCOMM_RESTART), the world size, the host it
runs on (``socket.gethostname()``) and the allocation's SLURM_NTASKS and SLURM_JOB_NODELIST.

    slurm_relaunch.py MARKER    launch 0: every rank commits a step, then SIGKILLs itself (an
                                abnormal end that ftcomm-run relaunches, on the allocation's hosts);
                                a relaunch reports "done" and exits

MARKER only makes the processes easy to find with ps. A committed step is an allreduce and
`ftcomm.core.runtime.note_committed`, as the training loops do after each step.
"""
import os
import signal
import socket

import numpy as np

import ftcomm
from ftcomm import settings
from ftcomm.core import runtime
from harness import report

comm = ftcomm.Communicator()
restart = settings.restart_count()
report(event="start", restart=restart, size=comm.size, host=socket.gethostname(),
       slurm_ntasks=os.environ.get("SLURM_NTASKS"), slurm_nodelist=os.environ.get("SLURM_JOB_NODELIST"))

if restart > 0:
    report(event="done", restart=restart, size=comm.size)
else:
    comm.allreduce(np.ones(4), op="sum", step=1)
    runtime.note_committed(1)
    comm.allreduce(np.ones(4), op="sum", step=2)  # every rank has noted its commit
    os.kill(os.getpid(), signal.SIGKILL)
