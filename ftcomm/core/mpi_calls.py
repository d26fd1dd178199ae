"""The process-wide lock around MPI calls, for Python code that calls mpi4py from a thread of its
own while the core may run a collective in another.

Open MPI 5.0's ULFM agreement is not safe while another thread drives MPI (an agreement then
decides, now and then, a value no rank contributed), so every MPI call of the core holds one lock
for the call itself (csrc/core/mpi_serial.h); Python's own calls take the same lock here. Hold it
around single non-blocking calls (Isend, Irecv, Test, Cancel), never around a wait.
"""
from __future__ import annotations

import contextlib

from .. import _C


@contextlib.contextmanager
def serialized():
    """Holds the MPI-call lock for the ``with`` block (recursive: nesting is allowed)."""
    _C.mpi_call_lock()
    try:
        yield
    finally:
        _C.mpi_call_unlock()
