"""Job for `ftcomm-run --restarts`: what it does depends on MODE and on the launch number
(FTCOMM_RESTART). Every rank first reports "start" (launch number, world size, node, pid).

    restart_job.py MARKER node-loss     launch 0: every rank commits a step, then world rank 2
                                        (on fake node n2) SIGKILLs its node's PRRTE daemon and the
                                        job ends; a relaunch reports "done" and exits
    restart_job.py MARKER commit-then-die   launch 0: every rank commits a step, then SIGKILLs
                                        itself; a relaunch reports "done" and exits
    restart_job.py MARKER raise         every rank commits a step, then raises
    restart_job.py MARKER die-early     every rank SIGKILLs itself before any committed step
    restart_job.py MARKER bad-args      every rank exits with status 2, as argparse does

MARKER only makes the processes easy to find with ps. A committed step is an allreduce and
`ftcomm.core.runtime.note_committed`, as the training loops do after each step.
"""
import os
import signal
import sys
import time

import numpy as np

import ftcomm
from ftcomm import settings
from ftcomm.core import runtime
from harness import report

mode = sys.argv[2]
comm = ftcomm.Communicator()
restart = settings.restart_count()
report(event="start", restart=restart, size=comm.size, node=settings.node_name_override(), pid=os.getpid())


def commit_a_step() -> None:
    comm.allreduce(np.ones(4), op="sum", step=1)
    runtime.note_committed(1)
    comm.allreduce(np.ones(4), op="sum", step=2)  # every rank has noted its commit


if restart > 0:
    report(event="done", restart=restart, size=comm.size)
elif mode == "node-loss":
    commit_a_step()
    if comm.world_rank == 2:
        assert settings.node_name_override() == "n2"
        os.kill(os.getppid(), signal.SIGKILL)  # the rank's parent is its node's daemon
    time.sleep(120)  # until the job's end takes this rank with it
elif mode == "commit-then-die":
    commit_a_step()
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "raise":
    commit_a_step()
    raise RuntimeError("the program's own error, on every rank")
elif mode == "die-early":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "bad-args":
    sys.exit(2)
