"""The daemon sessions of a launch: how Open MPI's daemons on other hosts were started, recorded by
mpi_configs/daemon_session.sh (the launch agent ``ftcomm-run --restarts`` gives mpirun), and
what ftcomm-run learns from them: which hosts lost their daemon, and which sessions are left to
kill.

PRRTE starts one session per host other than mpirun's own (``AGENT HOST prted ...``) and keeps it
open while the daemon lives. A session that ended by a signal, or with status 255 (ssh lost its
connection; a fake node's daemon died), lost its host. A daemon that PRRTE itself tells to go at
an abnormal end of the job exits with status 0 or 1: its host is still usable.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

# An agent status at or above this is a lost host: 128+N (a signal ended it) or 255.
LOST_STATUS = 128


@dataclass(frozen=True)
class Session:
    """One recorded daemon session: ``host``, ``pgid`` (the process group of its processes, the
    pid of the agent script PRRTE started), ``pid`` (the subshell that runs the agent and records
    its end; None until written) and ``status`` (the agent's exit status; None while it runs)."""

    host: str
    pgid: int
    pid: int | None
    status: int | None


def read_sessions(record_dir: str) -> list[Session]:
    """The sessions recorded in ``record_dir`` (none when it does not exist)."""
    sessions = []
    for path in Path(record_dir).glob("session-*"):
        try:
            fields = dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
            pid = int(fields["pid"]) if "pid" in fields else None
            status = int(fields["status"]) if "status" in fields else None
            sessions.append(Session(fields.get("host", ""), int(path.name[len("session-"):]), pid, status))
        except (OSError, ValueError):
            continue  # being written, or not ours
    return sessions


def lost_hosts(sessions: list[Session]) -> set[str]:
    """Hosts whose daemon session ended by a signal or with status 255: their daemon died, or the
    connection to them did."""
    return {s.host for s in sessions if s.status is not None and s.status >= LOST_STATUS and s.host}


def wait_for_ends(record_dir: str, limit_s: float) -> list[Session]:
    """The sessions, once each has recorded its end or after ``limit_s`` seconds. After the job's
    end a daemon's session ends within moments, but its agent's status is written by a process of
    its own that may be scheduled late on a busy machine."""
    deadline = time.monotonic() + limit_s
    while True:
        sessions = read_sessions(record_dir)
        if all(s.status is not None for s in sessions) or time.monotonic() >= deadline:
            return sessions
        time.sleep(0.05)


def _is_session_process(pid: int, record_dir: str) -> bool:
    """True when ``pid`` is a running process whose command line names ``record_dir``: the agent
    script or its subshell, and not some process that took a recorded pid later."""
    try:
        return record_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_sessions(record_dir: str) -> None:
    """SIGKILLs the process group of every session still running (the agent script, its subshell,
    the agent: ssh, or a fake node's shell and daemon parent). A remote daemon loses its ssh
    session and, with mpirun gone, its parent; it then ends by itself."""
    for session in read_sessions(record_dir):
        if session.status is not None:
            continue
        if not any(_is_session_process(pid, record_dir) for pid in (session.pgid, session.pid) if pid):
            continue
        try:
            os.killpg(session.pgid, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile
