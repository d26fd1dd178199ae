"""Two things the inner data planes do with torch's objects: give them a deadline, and let go of
them without waiting.

- ``deadline``: ftcomm's timeouts are seconds (floats); torch's options and stores take a
  ``timedelta``.
- ``release_in_background``: dropping the last reference to a torch object runs its destructor
  there and then, and some wait: gloo's group for a collective still waiting on a stopped peer (up
  to gloo's own timeout), a store client for a server that no longer answers. A rank that gives up
  on a group must go on to the step's agreement at once, so the last references are dropped on a
  thread of their own.
"""
from __future__ import annotations

import datetime
import threading


def deadline(timeout) -> datetime.timedelta:
    """``timeout`` seconds as the ``timedelta`` torch takes."""
    return datetime.timedelta(seconds=float(timeout))


def release_in_background(holder: list, what: str) -> None:
    """Drops the references in ``holder`` (the caller's last ones to the objects in it) on a daemon
    thread named ``ftcomm-{what}-release``; nothing when it holds only None."""
    if any(ref is not None for ref in holder):
        threading.Thread(target=holder.clear, name=f"ftcomm-{what}-release", daemon=True).start()
