"""Threads that watch a running launch: one relays the launcher's stdout while keeping its end
(``Relay``), one sees which rank's process ended first on this host (``FirstToEnd``). Both serve
MPICH, whose mpiexec ends the whole job when a rank dies (``reports.mpich_failure``).
"""
from __future__ import annotations

import os
import select
import sys
import threading

from .reports import pid_files


class Relay(threading.Thread):
    """Copies the launcher's stdout to ours as it comes, keeping its last bytes: MPICH's mpiexec
    reports there which process ended the job (reports.mpich_failure reads it)."""

    KEEP = 16384

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.tail = b""

    def run(self) -> None:
        out = sys.stdout.buffer
        while chunk := os.read(self.stream.fileno(), 65536):
            self.tail = (self.tail + chunk)[-self.KEEP:]
            if out is None:
                continue  # our stdout is gone: keep draining, or the launcher would block
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None

    def text(self) -> str:
        self.join(timeout=5)
        return self.tail.decode(errors="replace")


class FirstToEnd(threading.Thread):
    """Watches the ranks' processes on this host (the pids they publish in the run directory, one
    pidfd each) and records which world rank's process ended first: without ULFM that end is what
    ended the job, and mpiexec's own report may name another process, one it killed after.
    ``first`` is (world rank, pid), or None when it cannot tell: nothing ended while watched, or
    two ended together (within one wake-up of this thread)."""

    def __init__(self, run_dir: str, world_size: int):
        super().__init__(daemon=True)
        self.run_dir, self.world_size = run_dir, world_size
        self.first: tuple[int, int] | None = None
        self.done = threading.Event()
        self._any_ended = False

    def run(self) -> None:
        poller, watched, fds = select.poll(), {}, {}
        try:
            while not self.done.is_set():
                ended = []
                if len(watched) < self.world_size:  # ranks publish their pid once MPI is up
                    for rank, pid in pid_files(self.run_dir).items():
                        if rank in watched:
                            continue
                        watched[rank] = pid
                        try:
                            fd = os.pidfd_open(pid)
                        except OSError:  # already gone
                            ended.append((rank, pid))
                            continue
                        fds[fd] = (rank, pid)
                        poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(20):
                    ended.append(fds[fd])
                    poller.unregister(fd)
                if ended and not self._any_ended:
                    self._any_ended = True
                    self.first = ended[0] if len(ended) == 1 else None
        finally:
            for fd in fds:
                os.close(fd)

    def result(self) -> tuple[int, int] | None:
        self.done.set()
        self.join(timeout=5)
        return self.first
