"""The communication core, above the C++ extension and below everything else.

- ``runtime``: loads MPI (ftcomm owns MPI_Finalize), hands the core its settings, exit report.
- ``codes``: the core's enums (status, dtype, op, input problem, fault kind, message tag).
- ``buffers``, ``cuda``: user buffers (numpy, torch, CUDA) as the core takes them.
- ``communicator``: ``Communicator``, the fault-tolerant communicator (ULFM verbs, allreduce with
  commit, point-to-point), and ``p2p``: allgather and broadcast built on its exchange.
- ``outcome``: agreeing on a local outcome, and retrying after a recovery.
- ``events``: ``RecoveryEvent``, the record of a recovery every layer fills in.
- ``fault``: fault injection.

Nothing here knows of spares, training state or torch: those layers call down into this one.
"""
from . import runtime  # noqa: F401  (loads MPI before anything else touches it)
from .communicator import Communicator, recovery_policies, register_recovery_policy
from .events import RecoveryEvent

__all__ = ["Communicator", "RecoveryEvent", "recovery_policies", "register_recovery_policy"]
