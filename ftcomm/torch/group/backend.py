"""The ``"ftcomm"`` backend's registration with ``torch.distributed`` and the factory torch calls
for every ftcomm process group (the default group and ``dist.new_group`` subgroups).
"""
from __future__ import annotations

import datetime
import zlib

import torch.distributed as dist

from ... import settings
from ...core.codes import Tag
from ...core.communicator import Communicator
from . import late_rank
from .process_group import BACKEND_NAME, SUPPORTED_DEVICES, ProcessGroupFtcomm
from .rendezvous import take_active_comm

DEVICES = list(SUPPORTED_DEVICES)

# Subgroups made so far in this process, per member list: a rank only takes part in the creation
# of the groups it belongs to, so a count of all groups would differ between ranks.
_subgroups_made: dict[tuple, int] = {}


def _subgroup_tag(world_members: tuple) -> int:
    """The MPI_Comm_create_group tag of the next subgroup of these MPI_COMM_WORLD ranks: the same
    on each of them (it depends only on the members and how many groups of exactly these members
    this process made before), and different for different member lists (a CRC-32 of the list,
    in 2**24 buckets of 64 creations; groups are made one after the other in each process, so
    tags need only differ between groups whose members overlap)."""
    made = _subgroups_made.get(world_members, 0)
    _subgroups_made[world_members] = made + 1
    bucket = zlib.crc32(repr(world_members).encode()) % (1 << 24)
    return int(Tag.SUBGROUP) + (bucket << 6) + made % 64


def _timeout_seconds(timeout) -> float:
    """FTCOMM_TIMEOUT if set, else the timeout torch passed (init_process_group's ``timeout``)."""
    if not settings.timeout_is_set() and isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return settings.default_timeout()


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

    With spare ranks (``ftcomm-run --spares S``) the default group is the active communicator
    ``import ftcomm.torch`` made (``rendezvous.enter_spare_pool``), and a failure inside a
    resilient loop promotes a spare (``recovery_policy()``).

    Raises:
        RuntimeError: torch's world size is not MPI's (the job was not launched with one MPI
            process per torch rank), or a subgroup is asked for in a job with spare ranks.
    """
    from mpi4py import MPI

    late_rank.use_torch_default()
    rank, size = int(backend_opts.group_rank), int(backend_opts.group_size)
    timeout = _timeout_seconds(backend_opts.timeout)
    members = [int(r) for r in backend_opts.global_ranks_in_group]
    if settings.spares() > 0:
        return _group_with_spares(rank, size, members, timeout)
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
        world_members = tuple(to_world[g] for g in members)
        group = world.Get_group().Incl(list(world_members))
        base = world.Create_group(group, _subgroup_tag(world_members))
        group.Free()
    try:
        comm = Communicator(base, timeout=timeout)
    finally:
        base.Free()
    if comm.rank != rank or comm.size != size:
        raise RuntimeError(f"ftcomm backend: rank {comm.rank}/{comm.size} does not match torch's {rank}/{size}")
    return ProcessGroupFtcomm(comm, timeout=timeout)


def recovery_policy() -> str:
    """How the torch backend recovers from a failure inside a resilient loop: "spares" when the
    job has spare ranks (``ftcomm-run --spares S``), unless FTCOMM_RECOVERY_POLICY=shrink; else
    "shrink". ("respawn" is not offered here: respawned processes have no MPI_COMM_WORLD rank of
    the job, which the torch rendezvous needs.)"""
    if settings.spares() > 0 and settings.recovery_policy(default="spares") != "shrink":
        return "spares"
    return "shrink"


def _group_with_spares(rank: int, size: int, members: list, timeout: float) -> ProcessGroupFtcomm:
    if members:
        raise RuntimeError("ftcomm backend: subgroups (dist.new_group) are not supported in a job with "
                           "spare ranks (ftcomm-run --spares): a promoted spare could not rebuild them")
    comm = take_active_comm()
    if comm is None:
        raise RuntimeError("ftcomm backend: the job has spare ranks but no active communicator; "
                           "import ftcomm.torch before init_process_group, and only once per process")
    if comm.rank != rank or comm.size != size:
        raise RuntimeError(f"ftcomm backend: rank {comm.rank}/{comm.size} among the active ranks does not "
                           f"match torch's {rank}/{size} (RANK / WORLD_SIZE set by hand?)")
    return ProcessGroupFtcomm(comm, timeout=timeout, policy=recovery_policy(), joining=comm.promoted)


def register() -> None:
    """Registers the ``"ftcomm"`` backend with torch.distributed (once per process)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True, devices=DEVICES)
