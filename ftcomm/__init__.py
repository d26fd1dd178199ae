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

The package is layered, each layer calling only the ones below it (docs/DESIGN.md):
``core`` (communicator, buffers, codes, fault injection), ``membership`` (world, spares,
respawn, nodes), ``training`` (sharded optimizer, replicas, rebuild, elastic driver), ``torch``
(the torch.distributed backend) and ``launch`` (``ftcomm-run``); ``errors`` and ``settings`` sit
under all of them. This module re-exports the public names.
"""
import sys

from . import core  # noqa: F401  (loads MPI and the C++ core; owns MPI_Finalize)
from . import membership  # noqa: F401  (registers the spares and respawn recovery policies)
from .core import cuda, fault
from .core.communicator import Communicator
from .core.cuda import cuda_available, cuda_status
from .core.events import CorruptionEvent, RecoveryEvent, corruptions
from .core.runtime import ft_compiled_in, ft_enabled, mpi_family, ulfm_status
from .errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    FtError,
    InvalidInputError,
    MpiError,
    ProcFailedError,
    ResultsDifferError,
    RevokedError,
    SilentCorruptionError,
    StateLostError,
    UlfmUnavailableError,
)
from .membership.world import world

__version__ = "0.1.0"

# ``import ftcomm.cuda`` and ``import ftcomm.fault`` name the core's modules, as they always have.
sys.modules[f"{__name__}.cuda"], sys.modules[f"{__name__}.fault"] = cuda, fault

fault.load_from_env()

# The training layer needs torch (an optional dependency): loaded on first use.
_LAZY_MODULES = {"elastic": "ftcomm.training.elastic", "checkpoint": "ftcomm.training.checkpoint",
                 "training": "ftcomm.training"}
_LAZY_NAMES = {"ShardedOptimizer": "ftcomm.training.optimizer", "ElasticSampler": "ftcomm.training.data"}


def __getattr__(name):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'ftcomm' has no attribute {name!r}")


__all__ = [
    "Communicator",
    "world",
    "ft_enabled",
    "ft_compiled_in",
    "ulfm_status",
    "mpi_family",
    "cuda",
    "cuda_available",
    "cuda_status",
    "fault",
    "RecoveryEvent",
    "CorruptionEvent",
    "corruptions",
    "FtError",
    "ProcFailedError",
    "RevokedError",
    "CollectiveTimeoutError",
    "UlfmUnavailableError",
    "InvalidInputError",
    "CollectiveMismatchError",
    "MpiError",
    "StateLostError",
    "SilentCorruptionError",
    "ResultsDifferError",
    "ShardedOptimizer",
    "ElasticSampler",
    "elastic",
]
