"""ftcomm as a ``torch.distributed`` backend.

``import ftcomm.torch`` registers the backend name ``"ftcomm"`` (CPU tensors) and, when the job
was started by an MPI launcher without torchrun, fills in the rendezvous variables torch's default
``env://`` reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; see
``rendezvous.py``). A stock DDP script then needs only::

    import ftcomm.torch                               # registers "ftcomm"
    dist.init_process_group("ftcomm")                 # was "gloo"
    ...
    for x, y in ftcomm.torch.resilient(loader):       # was: for x, y in loader:

and runs with ``ftcomm-run -n 4 python train.py``. See docs/TORCH.md.
"""
from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from .. import Communicator
from .. import config as _config
from .executor import EXECUTOR
from .process_group import BACKEND_NAME, SUPPORTED, ProcessGroupFtcomm
from .recovery import RecoveryEvent, ResilientLoader, recoveries, resilient
from .rendezvous import apply_env_defaults
from .work import FtWork

DEVICES = ["cpu"]  # the CUDA path adds "cuda" here and in staging.SUPPORTED_DEVICES

_group_tag = [7200]


def _timeout_seconds(timeout) -> float:
    """FTCOMM_TIMEOUT if set, else the timeout torch passed (init_process_group's ``timeout``)."""
    if os.environ.get("FTCOMM_TIMEOUT"):
        return _config.default_timeout()
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return _config.default_timeout()


def _default_group_comm():
    from torch.distributed import distributed_c10d as c10d

    pg = c10d._world.default_pg
    return pg.comm if isinstance(pg, ProcessGroupFtcomm) else None


def create_process_group(backend_opts, backend_options=None) -> ProcessGroupFtcomm:
    """The factory torch calls (``extended_api=True``) for every ftcomm group this rank belongs to.

    The default group is MPI_COMM_WORLD reordered so that ranks are torch's ranks; a subgroup is
    built with ``MPI_Comm_create_group`` among its members only (non-members never get here).
    torch's global ranks are taken to be MPI_COMM_WORLD ranks unless the default group is an
    ftcomm one, whose own mapping is then used.

    Raises:
        RuntimeError: torch's world size is not MPI's (the job was not launched with one MPI
            process per torch rank), or the job has spare ranks (FTCOMM_SPARES > 0).
    """
    from mpi4py import MPI

    from .. import config

    if config.spares() > 0:
        raise RuntimeError(
            "ftcomm backend: spare ranks (ftcomm-run --spares) are not supported by the torch backend "
            "yet (a promoted spare would have to join DDP mid-run); it recovers by shrinking. Spares "
            "work with ftcomm.elastic and ShardedOptimizer (docs/SPARES.md)")
    rank, size = int(backend_opts.group_rank), int(backend_opts.group_size)
    timeout = _timeout_seconds(backend_opts.timeout)
    members = [int(r) for r in backend_opts.global_ranks_in_group]
    world = MPI.COMM_WORLD
    if not members:
        if size != world.Get_size():
            raise RuntimeError(
                f"ftcomm backend: torch world size {size} differs from the MPI world size "
                f"{world.Get_size()}; launch one MPI process per torch rank (ftcomm-run -n {size} ...)")
        base = world.Split(0, rank)
    else:
        parent = _default_group_comm()
        to_world = parent.world_ranks if parent is not None else list(range(world.Get_size()))
        group = world.Get_group().Incl([to_world[g] for g in members])
        _group_tag[0] += 1
        base = world.Create_group(group, _group_tag[0])
        group.Free()
    try:
        comm = Communicator(base, timeout=timeout)
    finally:
        base.Free()
    if comm.rank != rank or comm.size != size:
        raise RuntimeError(f"ftcomm backend: rank {comm.rank}/{comm.size} does not match torch's {rank}/{size}")
    return ProcessGroupFtcomm(comm, timeout=timeout)


def _register() -> None:
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=DEVICES)


_register()
if os.environ.get("FTCOMM_TORCH_ENV", "1") != "0":
    apply_env_defaults()

__all__ = [
    "BACKEND_NAME",
    "DEVICES",
    "SUPPORTED",
    "EXECUTOR",
    "FtWork",
    "ProcessGroupFtcomm",
    "RecoveryEvent",
    "ResilientLoader",
    "apply_env_defaults",
    "create_process_group",
    "recoveries",
    "resilient",
]
