"""Environment defaults so that a stock ``dist.init_process_group("ftcomm")`` works under
``ftcomm-run`` (or plain ``mpirun``), with no torchrun.

torch's default rendezvous (``env://``) reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; MPI
launchers set none of them. ``apply_env_defaults()`` (run by ``import ftcomm.torch``) fills in the
missing ones from MPI:

- RANK, WORLD_SIZE: the MPI_COMM_WORLD rank and size (with spare ranks: the rank among the
  active ranks and their number, see ``enter_spare_pool``).
- LOCAL_RANK, LOCAL_WORLD_SIZE: the rank and size among the ranks on this node.
- MASTER_ADDR: 127.0.0.1 when every rank is on one node, else world rank 0's host name.
- MASTER_PORT: a TCP port that was free on world rank 0, broadcast to every rank.

Variables that are already set are left alone. When MASTER_ADDR or MASTER_PORT is missing this is a
collective over MPI_COMM_WORLD (two broadcasts and one allgather of host names): every rank must
import ``ftcomm.torch``, as every rank of a stock script does. The TCP store torch builds from
these variables is used only while process groups are created; ftcomm's collectives never touch
it, so losing the rank that hosts it (world rank 0) after start-up does not matter.
"""
from __future__ import annotations

import os
import random
import socket

from ...membership.world import world

_active: list = []         # under spares: the active Communicator from ftcomm.world(), for the factory
_private_store: list = []  # a promoted spare's own TCP store (kept alive with the process)

_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _ephemeral_start() -> int:
    """First port of the range the OS hands to outgoing connections (Linux: 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "") -> int:
    """A TCP port that is free on this machine now, below the ephemeral range when one is: the
    port is released here and bound again by torch's TCP store a second or two later, and in
    between any outgoing connection on the machine (another job's, say) may be given an
    ephemeral port, while none takes one below the range. Random, so that jobs started together
    pick different ones."""
    start = _ephemeral_start()
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(max(1024, start - 12000), start)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all taken: let the OS pick
        s.bind((host, 0))
        return s.getsockname()[1]


def apply_env_defaults(comm=None) -> dict:
    """Sets the missing rendezvous variables (see the module docstring) from MPI.

    Args:
        comm: the mpi4py communicator whose ranks become torch ranks; default MPI_COMM_WORLD.

    Returns:
        The variables this call set, name -> value (empty if all were set already).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    env = os.environ
    added: dict[str, str] = {}

    def setdefault(name: str, value) -> None:
        if not env.get(name):
            env[name] = added[name] = str(value)

    setdefault("RANK", comm.Get_rank())
    setdefault("WORLD_SIZE", comm.Get_size())
    if not env.get("LOCAL_RANK") or not env.get("LOCAL_WORLD_SIZE"):
        local_rank = env.get("OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
            local_rank, local_size = node.Get_rank(), node.Get_size()
            node.Free()
        setdefault("LOCAL_RANK", local_rank)
        setdefault("LOCAL_WORLD_SIZE", local_size)
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        hosts = comm.allgather(socket.gethostname())
        one_node = len(set(hosts)) == 1
        addr = "127.0.0.1" if one_node else hosts[0]
        port = free_port("127.0.0.1" if one_node else "") if comm.Get_rank() == 0 else None
        port = comm.bcast(port, root=0)
        setdefault("MASTER_ADDR", addr)
        setdefault("MASTER_PORT", port)
    return added


def enter_spare_pool() -> None:
    """With spare ranks (FTCOMM_SPARES > 0, set by ``ftcomm-run --spares S``): builds the pool
    (``ftcomm.world()``, collective over every process). An active rank goes on at once with
    RANK / WORLD_SIZE set to its active rank and the number of active ranks. A spare waits here,
    inside ``import ftcomm.torch``, until a failure promotes it (or ends the process with status 0
    when the job finishes without it); it then goes on with the failed rank's RANK and a TCP store
    of its own for ``init_process_group`` (the job's store may have died with world rank 0, and
    the survivors are past their rendezvous; the ftcomm group does not use the store), which it
    reaches as a client even as rank 0 (TORCHELASTIC_USE_AGENT_STORE=True)."""
    import torch.distributed as dist

    comm = world()
    _active[:] = [comm]
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(comm.rank), str(comm.size)
    if comm.promoted:
        # Every rank, rank 0 included, connects to this store as a client (torch's "agent store"
        # mode): as rank 0 it would otherwise host a store and wait for the other ranks.
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        _private_store[:] = [store]
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(store.port)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"


def take_active_comm():
    """The active Communicator ``enter_spare_pool`` made (once; None without spares)."""
    return _active.pop() if _active else None
