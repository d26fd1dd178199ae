"""World rank 1 sleeps forever after creating the communicator; the others finish. Used to check
that `ftcomm-run --timeout` ends the whole job and leaves no rank behind.

Usage: hang_forever.py MARKER   (MARKER only makes the processes easy to find with ps)
"""
import time

import ftcomm
from harness import report

comm = ftcomm.Communicator()
report(started=True, pid=__import__("os").getpid())
if comm.world_rank == 1:
    while True:
        time.sleep(1)
