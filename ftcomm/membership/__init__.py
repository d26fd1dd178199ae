"""Membership: who is in the job. Above the core, below training and torch.

- ``world``: ``ftcomm.world()``, the job's starting communicator (spares wait inside it).
- ``spares``: the spare pool and ``recover(policy="spares")``.
- ``respawn``: ``recover(policy="respawn")`` over MPI_Comm_spawn.
- ``nodes``: which node each rank runs on.

Importing this package registers the "spares" and "respawn" policies with
``Communicator.recover`` and the spare pool's release with the exit path.
"""
from ..core import runtime
from ..core.communicator import register_recovery_policy
from . import nodes, respawn, spares
from .world import world

register_recovery_policy("spares", spares.recover_with_spares)
register_recovery_policy("respawn", respawn.recover_with_respawn)
runtime.at_shutdown(spares.release_at_exit)  # idle spares end with the job

__all__ = ["world", "nodes", "spares", "respawn"]
