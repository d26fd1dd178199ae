"""The processes of a job as ftcomm-run sees them on its own host: the MPI launcher it starts (which
must die with ftcomm-run), and the ranks, found by the pids they publish in the run directory
(``ftcomm.core.runtime``), since Open MPI starts them in process groups of their own.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

from .. import settings
from .reports import pid_files

# prctl(2): the signal a process gets when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may be loaded after fork
    _PRCTL = _LIBC.prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the launcher gets SIGKILL when ftcomm-run ends, even by SIGKILL (which no
    handler sees); without it a killed ftcomm-run leaves mpirun and its job running."""
    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # ftcomm-run died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def start_launcher(cmd: list[str], stdout=None) -> subprocess.Popen:
    """Starts the MPI launcher in a session (and process group) of its own, so that it and what
    it starts on this host can be signalled together, set to die with this process.

    Raises:
        OSError: the launcher cannot be started.
    """
    return subprocess.Popen(cmd, start_new_session=True, stdout=stdout, preexec_fn=_die_with_parent(os.getpid()))


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Sends ``signum`` to the launcher's process group (nothing when it is gone)."""
    try:
        os.killpg(proc.pid, signum)
    except OSError:
        pass


def end_launcher(proc: subprocess.Popen, grace_s: float) -> int:
    """Ends the launcher: SIGTERM to its process group (mpirun then ends its job and its daemons),
    SIGKILL to the group if it has not exited after ``grace_s`` seconds. Returns its status."""
    signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        return proc.wait()


def _is_rank_of(pid: int, run_dir: str) -> bool:
    """True when ``pid`` is a running process started with FTCOMM_RUN_DIR=``run_dir``: a rank of
    this launch, and not a process that took the pid of a rank that ended long ago."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{settings.RUN_DIR.name}={run_dir}".encode() in environ.split(b"\0")


def kill_ranks(run_dir: str) -> list[int]:
    """SIGKILLs every rank of the launch whose pid file is in ``run_dir`` and that still runs on
    this host. Returns their world ranks."""
    killed = []
    for rank, pid in sorted(pid_files(run_dir).items()):
        if _is_rank_of(pid, run_dir):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(rank)
            except OSError:
                pass  # ended meanwhile
    return killed
