"""The signals that stop ftcomm-run (SIGTERM from scancel or a CI runner, SIGINT, SIGHUP), and the
waits they interrupt: for the launcher to exit, and between relaunches.

A handler only notes the signal and wakes the wait (through a pipe); the job is then ended by
ordinary code (``supervise``), never from inside a handler.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time

CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """While entered (in the main thread), SIGTERM, SIGINT and SIGHUP are caught: ``signum`` is
    the first one caught (None until then). A signal that is ignored on entry (``nohup``
    ignores SIGHUP) stays ignored. The previous handlers come back on exit."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._wake_read = self._wake_write = -1

    def __enter__(self) -> "StopSignals":
        self._wake_read, self._wake_write = os.pipe()
        for fd in (self._wake_read, self._wake_write):
            os.set_blocking(fd, False)
        for signum in CAUGHT:
            try:
                if signal.getsignal(signum) == signal.SIG_IGN:
                    continue
                self._previous[signum] = signal.signal(signum, self._caught)
            except ValueError:  # not the main thread: signals cannot be caught here
                break
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _caught(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        try:
            os.write(self._wake_write, b"!")
        except OSError:  # the pipe is full: a wake-up is already waiting
            pass

    def wait(self, proc: subprocess.Popen, timeout_s: float | None) -> bool:
        """Waits until ``proc`` exits (True), or a signal is caught or ``timeout_s`` seconds pass
        (False; None: no limit). Blocks in poll() on a pidfd of ``proc`` and the wake-up pipe;
        where there are no pidfds it looks every 0.1 s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        try:
            while proc.poll() is None and self.signum is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if pidfd is None:
                    remaining = 0.1 if remaining is None else min(remaining, 0.1)
                poller.poll(None if remaining is None else remaining * 1000)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        return proc.returncode is not None

    def sleep(self, seconds: float) -> bool:
        """Sleeps ``seconds``; False as soon as a signal is caught (True otherwise)."""
        deadline = time.monotonic() + seconds
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        while self.signum is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            poller.poll(remaining * 1000)
        return False
