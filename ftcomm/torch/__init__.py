"""ftcomm as a ``torch.distributed`` backend.

``import ftcomm.torch`` registers the backend name ``"ftcomm"`` (CPU tensors) and, when the job
was started by an MPI launcher without torchrun, fills in the rendezvous variables torch's default
``env://`` reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; see
``rendezvous.py``). A stock DDP script then needs only::

    import ftcomm.torch                               # registers "ftcomm"
    dist.init_process_group("ftcomm")                 # was "gloo"
    ...
    for x, y in ftcomm.torch.resilient(loader):       # was: for x, y in loader:

and runs with ``ftcomm-run -n 4 python train.py``. With spare ranks (``ftcomm-run --spares S``)
a spare waits inside this import until a failure promotes it, and the loop is written
``loader = resilient(loader, model=ddp, optimizer=opt)``; ``for epoch in loader.epochs(E): for
batch in loader:`` so that the newcomer can join (``join.py``). See docs/TORCH.md.

Modules: ``backend`` (registration, the process-group factory), ``process_group`` (the
collectives), ``work`` and ``executor`` (Work objects, the communication thread), ``step_state``
(process-wide step state), ``loader`` (``resilient``), ``join`` (hand-over to a promoted spare),
``resplit`` (re-splitting an epoch's samples), ``rendezvous`` (environment under MPI launchers),
``zero`` (``ZeroRedundancyOptimizer``: ZeRO-1 whose shards survive rank loss), ``checkpoint``
(the loop's disk checkpoints in ``torch.distributed.checkpoint`` format, and resuming from them).
"""
from __future__ import annotations

from .. import settings
from ..core.events import RecoveryEvent
from .group.backend import DEVICES, create_process_group, recovery_policy, register
from .group.executor import EXECUTOR
from .group.process_group import BACKEND_NAME, SUPPORTED, ProcessGroupFtcomm, monitored_barrier
from .group.rendezvous import apply_env_defaults, enter_spare_pool
from .group.step_state import recoveries
from .group.work import FtWork
from .loop.loader import ResilientLoader, resilient
from .zero.optimizer import ZeroRedundancyOptimizer

register()
if settings.torch_env():
    apply_env_defaults()
if settings.spares() > 0:
    enter_spare_pool()  # a spare waits here until it is promoted

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
    "monitored_barrier",
    "recoveries",
    "recovery_policy",
    "resilient",
    "ZeroRedundancyOptimizer",
]
