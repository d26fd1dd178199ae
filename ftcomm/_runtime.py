"""Process-wide state: loads MPI through mpi4py (with ftcomm owning MPI_Finalize), loads the core,
checks they talk to the same MPI library, and records failures seen, for the exit report that
ftcomm-run reads."""
from __future__ import annotations

import atexit
import json
import os
import sys

import mpi4py

if "mpi4py.MPI" not in sys.modules:
    # mpi4py would finalize at exit by itself; after a failure that can hang. ftcomm finalizes
    # instead, under a watchdog (see shutdown below).
    mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402  (must follow the rc setting)

from . import _C  # noqa: E402
from . import config  # noqa: E402


def _check_same_mpi() -> None:
    ours = _C.mpi_library_version().split(",")[0].strip()
    theirs = MPI.Get_library_version().split(",")[0].strip()
    if ours != theirs:
        raise ImportError(
            f"ftcomm was built against '{ours}' but mpi4py loaded '{theirs}'. Rebuild ftcomm in this "
            "environment (pip install --force-reinstall --no-deps .) or make mpi4py load the same MPI "
            "(MPI4PY_LIBMPI / the env's MPI package)."
        )


_check_same_mpi()

if MPI.Comm.Get_parent() != MPI.COMM_NULL:
    # A process started by recover(policy="respawn") (ftcomm/spares.py): its MPI_COMM_WORLD ranks
    # start at 0 again, so it must not take world rank 0's slots in the run directory (liveness
    # table, pid and exit-report files) nor the fault-injection plan meant for the first job.
    for _var in ("FTCOMM_RUN_DIR", "FTCOMM_FAULT", "FTCOMM_SPARES"):
        os.environ.pop(_var, None)

lost_world_ranks: set[int] = set()


def record_lost(world_ranks) -> None:
    lost_world_ranks.update(int(r) for r in world_ranks)


def _publish_pid() -> None:
    """Leaves this rank's pid in the run directory, so that `ftcomm-run --timeout` can kill a
    rank that hangs: Open MPI may start ranks outside the launcher's process group."""
    run_dir = os.environ.get("FTCOMM_RUN_DIR")
    if run_dir:
        try:
            with open(os.path.join(run_dir, f"pid-rank{MPI.COMM_WORLD.Get_rank()}"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass


_publish_pid()

# Set when the program ends by an uncaught exception: its exit status would be 1, but MPI_Finalize
# may overrun after failures and the watchdog then exits with 0, so the exit report carries it to
# ftcomm-run, which must not call such a job "recovered".
_uncaught = False
_previous_excepthook = sys.excepthook


def _note_uncaught(exc_type, exc, tb) -> None:
    global _uncaught
    _uncaught = True
    _previous_excepthook(exc_type, exc, tb)


sys.excepthook = _note_uncaught


def _write_exit_report() -> None:
    run_dir = os.environ.get("FTCOMM_RUN_DIR")
    if not run_dir:
        return
    report = {"world_rank": MPI.COMM_WORLD.Get_rank(), "pid": os.getpid(), "lost": sorted(lost_world_ranks),
              "uncaught_exception": _uncaught}
    try:
        with open(os.path.join(run_dir, f"rank{report['world_rank']}.json"), "w") as f:
            json.dump(report, f)
    except OSError:
        pass


def shutdown() -> None:
    """Writes this rank's exit report and finalizes MPI. MPI_Finalize in ULFM mode is collective over
    the survivors; if it does not return within FTCOMM_FINALIZE_TIMEOUT seconds the watchdog ends
    the process with status 0 (its work is done)."""
    _write_exit_report()
    spares = sys.modules.get("ftcomm.spares")
    if spares is not None:
        spares.release_at_exit(crashed=_uncaught)  # idle spares end with the job
    _C.liveness_mark_exiting()  # from here on no peer may fence this rank as stuck
    if MPI.Is_initialized() and not MPI.Is_finalized():
        sys.stdout.flush()
        sys.stderr.flush()
        token = _C.watchdog_arm(config.finalize_timeout(), "MPI_Finalize", True)
        MPI.Finalize()
        _C.watchdog_disarm(token)


atexit.register(shutdown)
