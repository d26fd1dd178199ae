"""Process-wide state: loads MPI through mpi4py (with ftcomm owning MPI_Finalize), loads the core,
checks they talk to the same MPI library, hands the core its settings, and records failures seen,
for the exit report that ftcomm-run reads. At exit it runs the shutdown hooks that higher layers
registered (``at_shutdown``), then finalizes MPI under a watchdog."""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import select
import signal
import socket
import stat
import sys
import termios
import threading
import time

import mpi4py

if "mpi4py.MPI" not in sys.modules:
    # mpi4py would finalize at exit by itself; after a failure that can hang. ftcomm finalizes
    # instead, under a watchdog (see shutdown below).
    mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402  (must follow the rc setting)

from .. import settings  # noqa: E402
from ..errors import FtError, InvalidInputError  # noqa: E402


def shadowing_source_tree() -> str | None:
    """Why the core may not match this environment when the ftcomm imported is not the installed
    one: a source tree in the current folder (first on ``sys.path``) hides the package this
    environment installed (built for its MPI). Returns that, in words, else None."""
    import importlib.metadata
    import json as _json
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    imported = Path(__file__).resolve().parents[1]
    try:
        dist = importlib.metadata.distribution("ftcomm")
    except importlib.metadata.PackageNotFoundError:
        return None
    installed = None
    direct = _json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable") and direct.get("url", "").startswith("file:"):
        installed = Path(unquote(urlparse(direct["url"]).path)) / "ftcomm"  # an editable install: its tree
    elif dist.files and any(str(f) == "ftcomm/__init__.py" for f in dist.files):
        installed = Path(dist.locate_file("ftcomm/__init__.py")).parent
    if installed is None or installed.resolve() == imported:
        return None
    return (f"the ftcomm imported is the source tree {imported} (the current folder comes first on sys.path), not "
            f"the one this environment installed, {installed.resolve()}: run from another folder, or install "
            "this tree into this environment")


def _mismatch(text: str) -> str:
    """``text`` about a core built for another MPI, led by the likelier cause when there is one."""
    shadowed = shadowing_source_tree()
    return text if shadowed is None else f"{shadowed}. (Otherwise: {text})"


try:
    from .. import _C  # noqa: E402
except ImportError as exc:
    if "libmpi" not in str(exc):
        raise
    # The core links one MPI's library (FTCOMM_MPI at build time); mpi4py loaded another one.
    raise ImportError(_mismatch(
        f"ftcomm's compiled core was built against another MPI than the one mpi4py loaded "
        f"('{MPI.Get_library_version().strip().splitlines()[0].split(',')[0]}'): {exc}. Rebuild ftcomm in this "
        "environment with FTCOMM_MPI set to this MPI (pip install --force-reinstall --no-deps .), or use the "
        "environment it was built for; one source tree holds one editable build (README, Quick start)."
    )) from exc


def _library_name(version_text: str) -> str:
    """The first line of MPI_Get_library_version's text, up to a comma: "Open MPI v5.0.11",
    "MPICH Version:      5.0.2"."""
    return version_text.strip().splitlines()[0].split(",")[0].strip() if version_text.strip() else ""


def _check_same_mpi() -> None:
    ours = _library_name(_C.mpi_library_version())
    theirs = _library_name(MPI.Get_library_version())
    if ours != theirs:
        raise ImportError(_mismatch(
            f"ftcomm was built against '{ours}' but mpi4py loaded '{theirs}'. Rebuild ftcomm in this "
            "environment (pip install --force-reinstall --no-deps .) or make mpi4py load the same MPI "
            "(MPI4PY_LIBMPI / the env's MPI package)."
        ))


_check_same_mpi()

ft_compiled_in = _C.ft_compiled_in  # () -> bool: built against an MPI that declares ULFM's functions
ft_enabled = _C.ft_enabled  # () -> bool: this job runs with ULFM switched on (found once, at start-up)


def ulfm_status() -> str:
    """Whether this job can recover from a rank failure, and why not, in words: which MPI runs
    (e.g. "Open MPI v5.0.11 runs with ULFM on (MPIX_FT)"), or what is missing and what recovery
    would need ("MPICH 5.0.2 (device ch4:ucx ofi) has no fault tolerance: ..."). ``ft_enabled()``
    is the same answer as a bool. Found at start-up: Open MPI's MPIX_FT attribute of
    MPI_COMM_WORLD, MPICH's MPIR_CVAR_ENABLE_FT control variable."""
    return _C.ft_status()


def mpi_family() -> str:
    """"Open MPI", "MPICH" or "MPI" (another library): the MPI ftcomm was built against."""
    return _C.mpi_family()


_ft_on = ft_enabled()  # probed now, at start-up, while MPI is surely initialized

if MPI.Comm.Get_parent() != MPI.COMM_NULL:
    # A process started by recover(policy="respawn") (ftcomm/membership/respawn.py): its
    # MPI_COMM_WORLD ranks start at 0 again, so it must not take world rank 0's slots in the run
    # directory (liveness table, pid and exit-report files) nor the first job's fault plan.
    settings.forget_job_settings()

_C.configure(fence_timeout_s=settings.fence_timeout(), run_dir=settings.run_dir() or "",
             profile=settings.profile(), late_rank_fence=settings.late_rank_fence())


def set_late_rank_fence(fence: bool) -> None:
    """Changes the late-rank policy for the waits whose deadline passes from now on."""
    _C.set_late_rank_fence(bool(fence))


lost_world_ranks: set[int] = set()

# The longest MPI_Finalize may take at exit once this rank has seen ranks fail.
FINALIZE_AFTER_FAILURE_S = 5.0


def record_lost(world_ranks) -> None:
    lost_world_ranks.update(int(r) for r in world_ranks)


def _publish_pid() -> None:
    """Leaves this rank's pid in the run directory, so that `ftcomm-run --timeout` can kill a
    rank that hangs: Open MPI may start ranks outside the launcher's process group."""
    run_dir = settings.run_dir()
    if run_dir:
        try:
            with open(os.path.join(run_dir, f"pid-rank{MPI.COMM_WORLD.Get_rank()}"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass


_publish_pid()


def _watch_launcher() -> None:
    """Ends this rank when the ftcomm-run that started it is gone (SIGKILLed: it had no chance to
    end the job), instead of leaving it an orphan: Open MPI starts ranks in process groups of
    their own, and its mpirun, even dying with ftcomm-run, does not kill the ranks on its host.
    Only for ranks on ftcomm-run's host (elsewhere the rank's daemon goes with its ssh session),
    and only when FTCOMM_LAUNCHER names a process that is running now: never on a guess (a rank
    started without ftcomm-run, a pid already gone or taken by another process). The thread
    blocks in poll() on a pidfd of ftcomm-run: no CPU until ftcomm-run exits, which in a normal
    run happens only after every rank has ended."""
    found = settings.launcher()
    if found is None or not hasattr(os, "pidfd_open"):
        return
    host, pid, start = found
    if host != socket.gethostname():
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone already, or not visible from here
        return
    if settings.process_start_time(pid) != start:  # the pid now names another process
        os.close(pidfd)
        return
    threading.Thread(target=_end_when_gone, args=(pidfd,), name="ftcomm-launcher-watch", daemon=True).start()


_launcher_gone_hooks: list = []


def when_launcher_gone(hook) -> None:
    """Registers ``hook()`` to run when ftcomm-run is gone, just before this rank ends itself:
    nobody will relaunch the job, so what was kept for a relaunch can go (node-local segments).
    A hook must not raise and must not wait long."""
    _launcher_gone_hooks.append(hook)


def _end_when_gone(pidfd: int) -> None:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)  # readable once the process has exited
    while not poller.poll():
        pass
    for hook in _launcher_gone_hooks:
        try:
            hook()
        except Exception:  # noqa: BLE001 (ending: never raise)
            pass
    os.kill(os.getpid(), signal.SIGKILL)


_watch_launcher()

_committed_noted = False


def note_committed(step: int) -> None:
    """Called by the training loops after each committed step. The first call in a process
    leaves ``committed-rank<world rank>`` (holding the step) in the run directory: ftcomm-run
    --restarts relaunches a job only if it committed a step (a failure before that would only
    repeat). Later calls cost nothing."""
    global _committed_noted
    if _committed_noted:
        return
    _committed_noted = True
    run_dir = settings.run_dir()
    if run_dir:
        try:
            with open(os.path.join(run_dir, f"committed-rank{MPI.COMM_WORLD.Get_rank()}"), "w") as f:
                f.write(str(int(step)))
        except OSError:
            pass

# Set when the program ends by an uncaught exception: its exit status would be 1, but MPI_Finalize
# may overrun after failures and the watchdog then exits with 0, so the exit report carries it to
# ftcomm-run, which must not call such a job "recovered".
_uncaught = False
# Whether that exception reports a failure of other ranks or of the machines (ProcFailedError,
# StateLostError, a timeout: ftcomm's errors but bad input): ftcomm-run --restarts relaunches
# such a job, where the program's own error on every rank would only repeat.
_uncaught_failure = False
_previous_excepthook = sys.excepthook


def _note_uncaught(exc_type, exc, tb) -> None:
    global _uncaught, _uncaught_failure
    _uncaught = True
    _uncaught_failure = issubclass(exc_type, FtError) and not issubclass(exc_type, InvalidInputError)
    _previous_excepthook(exc_type, exc, tb)


sys.excepthook = _note_uncaught

# The status the program gave sys.exit (argparse's 2 on bad arguments), for the exit report:
# ftcomm-run --restarts does not relaunch a job whose every rank ended by the same non-zero exit
# (it would end so again). An atexit function cannot see the status, so sys.exit notes it first.
_exit_status = None
_sys_exit = sys.exit


def _exit_noting_status(status=None):
    global _exit_status
    if threading.current_thread() is threading.main_thread():  # elsewhere it ends only a thread
        _exit_status = status
    _sys_exit(status)


sys.exit = _exit_noting_status


def _exit_status_code() -> int:
    """The exit status this process ends with, as far as Python decides it: 1 after an uncaught
    exception; sys.exit's status (None is 0, a message 1, an int its low 8 bits); else 0."""
    if _uncaught:
        return 1
    if _exit_status is None:
        return 0
    if isinstance(_exit_status, int):
        return _exit_status & 0xFF
    return 1


def _write_exit_report() -> None:
    run_dir = settings.run_dir()
    if not run_dir:
        return
    report = {"world_rank": MPI.COMM_WORLD.Get_rank(), "pid": os.getpid(), "lost": sorted(lost_world_ranks),
              "uncaught_exception": _uncaught, "failure": _uncaught_failure, "exit_status": _exit_status_code()}
    try:
        with open(os.path.join(run_dir, f"rank{report['world_rank']}.json"), "w") as f:
            json.dump(report, f)
    except OSError:
        pass


_shutdown_hooks: list = []


def at_shutdown(hook) -> None:
    """Registers ``hook(crashed: bool)`` to run at exit before MPI_Finalize (``crashed``: the
    program ends by an uncaught exception). Higher layers use it to leave cleanly (the spare pool
    releases its idle spares); a hook must not raise and must not wait long."""
    _shutdown_hooks.append(hook)


# How long an aborting rank waits for the launcher to read its last words (see below), seconds.
STDERR_DRAIN_S = 2.0


def _wait_for_launcher_to_read(stream, limit_s: float) -> None:
    """Waits until the pipe behind ``stream`` holds no unread bytes, at most ``limit_s`` seconds.
    MPI_Abort makes the launcher (MPICH's mpiexec) end every process at once, and what a rank
    wrote just before, still in the pipe to the launcher, is then lost: under load the reason
    for the abort went missing. A terminal or a file is read by nobody: no wait."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        end = time.monotonic() + limit_s
        unread = bytearray(4)
        while time.monotonic() < end:
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            if not int.from_bytes(unread, sys.byteorder):
                return
            time.sleep(0.005)
    except (AttributeError, OSError, ValueError):  # no stream, or a closed one
        return


def shutdown() -> None:
    """Writes this rank's exit report, runs the shutdown hooks and finalizes MPI. MPI_Finalize in
    ULFM mode is collective over the survivors (an agreement), without the runtime fence that
    follows it in Open MPI (``_C.skip_finalize_fence``); if it does not return within
    FTCOMM_FINALIZE_TIMEOUT seconds (at most 5 once this rank has seen ranks fail) the watchdog
    ends the process with status 0 (its work is done)."""
    _write_exit_report()
    if _uncaught and not _ft_on and MPI.Is_initialized() and not MPI.Is_finalized() \
            and MPI.COMM_WORLD.Get_size() > 1:
        # Without ULFM the peers cannot go on without this rank, and MPI_Finalize would wait for
        # them (MPICH's does, forever): end the whole job now, saying why.
        try:
            sys.stderr.write(f"ftcomm: world rank {MPI.COMM_WORLD.Get_rank()} ended by an uncaught exception; "
                             f"ending the job, which cannot recover without ULFM: {ulfm_status()}\n")
            sys.stderr.flush()
            _wait_for_launcher_to_read(sys.stderr, STDERR_DRAIN_S)
        except (AttributeError, OSError, ValueError):
            pass  # the program closed or dropped stderr: end the job all the same
        MPI.COMM_WORLD.Abort(1)
    for hook in _shutdown_hooks:
        try:
            hook(_uncaught)
        except Exception:  # noqa: BLE001 (exit path: never raise)
            pass
    _C.liveness_mark_exiting()  # from here on no peer may fence this rank as stuck
    if MPI.Is_initialized() and not MPI.Is_finalized():
        sys.stdout.flush()
        sys.stderr.flush()
        timeout = settings.finalize_timeout()
        if lost_world_ranks:
            timeout = min(timeout, FINALIZE_AFTER_FAILURE_S)
        # Every rank does this (it depends only on the job's ULFM setting): ULFM's finalize agrees
        # on the survivors, then a runtime fence that after failures, rarely, never completes.
        _C.skip_finalize_fence()
        token = _C.watchdog_arm(timeout, "MPI_Finalize", True)
        MPI.Finalize()
        _C.watchdog_disarm(token)


atexit.register(shutdown)
