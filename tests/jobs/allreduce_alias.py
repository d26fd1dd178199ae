"""A bucket whose buffers alias (the same array twice, or two overlapping views) in an allreduce
step voided by a flip in transit (FTCOMM_FAULT kind=bitflip, checksums on): the array must be
bitwise as before on every rank (the rings' undo logs are replayed last ring first).

Usage: allreduce_alias.py same|overlap
"""
import sys

import numpy as np

import ftcomm
from harness import report

comm = ftcomm.Communicator()
comm.allreduce(np.ones(4, np.float32), step=0, checksums=True)
array = np.arange(1000, dtype=np.float32) + 10 * comm.world_rank
before = array.copy()
bucket = [array, array] if sys.argv[1] == "same" else [array[:600], array[400:]]
error = None
try:
    comm.allreduce(bucket, step=1, checksums=True, chunk_bytes=256)
except ftcomm.SilentCorruptionError as exc:
    error = type(exc).__name__
report(error=error, unchanged=bool(np.array_equal(array, before)))
