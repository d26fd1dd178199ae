"""Respawn: new processes take the failed ranks' places (``recover(policy="respawn")``).

The survivors start the missing number of processes running the same program (MPI_Comm_spawn),
merge with them (MPI_Intercomm_merge), and run the spare pool's assignment over the merged
communicator (``spares.assemble``); ``ftcomm.world()`` in a spawned process joins that merge.
Refused on Open MPI 5.0.x (``respawn_supported``), where recovery falls back to shrink.
"""
from __future__ import annotations

import sys
import time

from .. import settings
from ..core import liveness
from ..core.communicator import Communicator
from ..core.outcome import agreed
from ..errors import FtError, MpiError
from .spares import assemble, finish_recovery, shrink_instead


def recover_with_respawn(old, timeout: float):
    """``old.recover(policy="respawn")`` (see ``Communicator.recover``)."""
    shrunk = old.shrink_to_survivors(timeout)
    missing = old.size - shrunk.size
    supported, why_not = respawn_supported()
    if not supported:
        return shrink_instead("respawn", old, shrunk, why_not)
    t0 = time.perf_counter()
    try:
        merged = spawn_and_merge(shrunk, missing, timeout)
        with agreed(merged, "respawn", timeout=timeout):
            active, _ = assemble(merged, old.rank, old.size, old.last_committed_step, timeout, "respawn")
    except FtError as error:
        return shrink_instead("respawn", old, shrunk, f"respawn failed: {error}")
    active.recovery.recover_s = time.perf_counter() - t0
    finish_recovery(old, active, "respawn")
    return active


def respawn_supported() -> tuple[bool, str]:
    """(whether ``policy="respawn"`` tries MPI_Comm_spawn, the reason if not). Refused on Open MPI
    5.0.x, where the spawn, merge and the collectives that follow do work, but the job's end does
    not: MPI_Finalize across the spawned job hangs or crashes in about one run in four (the
    parents' disconnect reaches the new processes through a TCP endpoint Open MPI never set up),
    so the launcher reports an abnormal end. Respawned processes also have no rank in the
    parents' MPI_COMM_WORLD (``world_ranks`` -1), which the sharded optimizer's layout and the
    hang fencing need. Evidence: docs/SPARES.md. FTCOMM_RESPAWN=force tries it anyway."""
    from mpi4py import MPI

    if settings.respawn_forced():
        return True, ""
    if "Open MPI v5.0." in MPI.Get_library_version():
        return False, ("MPI_Comm_spawn is unreliable in Open MPI 5.0.x (MPI_Finalize across the spawned "
                       "job hangs or crashes), see docs/SPARES.md; FTCOMM_RESPAWN=force tries it")
    return True, ""


def spawned() -> bool:
    """True in a process started by ``recover(policy="respawn")`` (it has a parent)."""
    from mpi4py import MPI

    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def spawn_and_merge(shrunk, count: int, timeout: float):
    """Starts ``count`` processes running this program (MPI_Comm_spawn, collective over
    ``shrunk``, root 0) and returns the Communicator over survivors + newcomers (merged,
    survivors first). Spawn and merge cannot be interrupted: past ``timeout`` the watchdog kills
    this rank.

    Raises:
        MpiError: MPI reports a failure.
    """
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("host", MPI.Get_processor_name())  # Open MPI: else "all slots already filled"
    try:
        with liveness.watchdog(timeout, "MPI_Comm_spawn"):
            inter = shrunk.mpi_comm.Spawn(sys.executable, args=list(sys.orig_argv[1:]), maxprocs=count,
                                          info=info, root=0)
            merged = inter.Merge(high=False)
    except MPI.Exception as error:
        raise MpiError(f"MPI_Comm_spawn/merge: {error.Get_error_string()}") from error
    finally:
        info.Free()
    return Communicator(merged, timeout=timeout)


def join_respawn(timeout: float):
    """``ftcomm.world()`` in a respawned process: merges with the survivors and takes a failed
    rank's place. Returns the active Communicator (``promoted`` True).

    Raises:
        ProcFailedError: a process failed while joining.
    """
    from mpi4py import MPI

    merged = Communicator(MPI.Comm.Get_parent().Merge(high=True), timeout=timeout)
    with agreed(merged, "respawn: joining the survivors", timeout=timeout):
        active, _ = assemble(merged, -1, 0, -1, timeout, "respawn")
    return active
