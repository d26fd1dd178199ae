"""Job script (fake device buffers, CPU-only): the corruption guard on the staged device path. A
flip in transit (FTCOMM_FAULT point=reduce_scatter ... kind=bitflip) must void the step on every
rank as for host buffers: SilentCorruptionError, the device buffer unchanged, the redo right.

    FTCOMM_FAULT=... python device_guard.py
"""
import numpy as np
from fake_cuda import FakeCudaArray

import ftcomm
from ftcomm import cuda
from harness import report

cuda._use_host_memory_for_tests()
comm = ftcomm.Communicator()
world_rank, n = comm.world_rank, comm.size
comm.allreduce(np.ones(4, np.float32), step=0, checksums=True)
values = np.arange(4000, dtype=np.float32) + world_rank
device = FakeCudaArray(values)
error = None
try:
    comm.allreduce(device, step=1, checksums=True, chunk_bytes=1024)
except ftcomm.SilentCorruptionError as exc:
    error = {"type": type(exc).__name__, "ranks": exc.ranks, "unchanged": bool(np.array_equal(device.numpy(), values))}
    comm.allreduce(device, step=1, checksums=True, chunk_bytes=1024)  # the redo
want = n * np.arange(4000, dtype=np.float32) + sum(comm.world_ranks)
report(kind="guard", error=error, correct=bool(np.array_equal(device.numpy(), want)))
