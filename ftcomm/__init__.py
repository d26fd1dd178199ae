"""ftcomm: fault-tolerant collectives for data-parallel training on MPI with ULFM.

Quick use::

    import numpy as np, ftcomm
    comm = ftcomm.Communicator()           # over MPI_COMM_WORLD
    grad = np.ones(1 << 20, np.float32)
    while True:
        try:
            comm.allreduce(grad, op="sum")
            break
        except ftcomm.ProcFailedError:
            comm = comm.recover()           # survivors only; retry the same step

Run it with ``ftcomm-run -n 4 python script.py``.
"""
from . import _runtime  # noqa: F401  (loads MPI and the core; owns MPI_Finalize)
from . import fault
from ._C import ft_compiled_in, ft_enabled
from .communicator import Communicator, world
from .cuda import cuda_available, cuda_status  # issue #6: GPU buffers
from .errors import (
    CollectiveTimeoutError,
    FtError,
    InvalidInputError,
    MpiError,
    ProcFailedError,
    RevokedError,
    StateLostError,
    UlfmUnavailableError,
)

__version__ = "0.1.0"

fault.load_from_env()

__all__ = [
    "Communicator",
    "world",
    "ft_enabled",
    "ft_compiled_in",
    "cuda_available",
    "cuda_status",
    "fault",
    "FtError",
    "ProcFailedError",
    "RevokedError",
    "CollectiveTimeoutError",
    "UlfmUnavailableError",
    "InvalidInputError",
    "MpiError",
    "StateLostError",
]

# Issue #4: sharded optimizer with buddy replicas, elastic driver. Loaded on first use, because
# they need torch (an optional dependency).
_LAZY_MODULES = ("optim", "replica", "rebuild", "shard", "data", "elastic", "checkpoint")
_LAZY_NAMES = {"ShardedOptimizer": "optim", "ElasticSampler": "data"}


def __getattr__(name):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
    raise AttributeError(f"module 'ftcomm' has no attribute {name!r}")


__all__ += ["ShardedOptimizer", "ElasticSampler"]
