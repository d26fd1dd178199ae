"""``ftcomm.world()``: the communicator a job starts with, whatever its membership set-up."""
from __future__ import annotations

from .. import settings
from ..core.communicator import Communicator
from . import respawn, spares


def world(timeout: float | None = None) -> Communicator:
    """A Communicator over MPI_COMM_WORLD, or, with spares (``ftcomm-run --spares S``, which sets
    FTCOMM_SPARES), over the active ranks: on an idle spare this call returns only once the spare
    is promoted into a failed rank's place (``promoted`` True), and ends the process with status 0
    when the job finishes without it. In a process started by ``recover(policy="respawn")`` it
    joins the survivors and returns with ``promoted`` True. See ftcomm/membership/spares.py.

    Args:
        timeout: deadline of each phase of the set-up, seconds (default FTCOMM_TIMEOUT).

    Raises:
        ProcFailedError: a rank died during the set-up (or, on a spare, every active rank died).
        CollectiveTimeoutError: a rank did not join within ``timeout`` seconds.
        InvalidInputError: FTCOMM_SPARES leaves no active rank.
    """
    timeout = settings.resolve_timeout(timeout)
    if respawn.spawned():
        return respawn.join_respawn(timeout)
    if settings.spares() > 0:
        return spares.start(settings.spares(), timeout)
    return Communicator(timeout=timeout)
