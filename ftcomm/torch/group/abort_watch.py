"""Another member's abort of an inner group, seen through the group's store without ever blocking
the rank that waits on a collective (``inner_group.py``).

A member that gives up on an inner group writes an abort key into its ``TCPStore``. The others
look for it while they wait. A store client's call can block with no end when the store's server
(the group's rank 0) is stopped: ``check`` and ``get`` then wait on a socket that never answers,
past ``set_timeout`` (torch 2.13, checked here). So the looks run on a thread of their own, over
a client connection of their own (``group_store.py``: a client serialises its calls, and a stuck
look must not hold up this rank's own ``set`` of the key), and the waiting rank only reads their
outcome: the key seen, the store failed, or a look unanswered for longer than ``answer_s``.
"""
from __future__ import annotations

import threading
import time

ABORT_KEY = "ftcomm/aborted"


class AbortWatch:
    """Looks for ``ABORT_KEY`` in a store every ``every_s`` seconds while ``looking()``.

    Args:
        client: the group's store through a client that only the watches use (``GroupStores``'s
            watch store: the group's own key prefix on this rank's second connection).
        every_s: seconds between two looks.
        answer_s: seconds a look may take; past it, the store counts as gone.
    """

    def __init__(self, client, every_s: float, answer_s: float):
        self._client = client
        self._every_s, self._answer_s = every_s, answer_s
        self._wanted = threading.Event()
        self._closed = False
        self._seen: str | None = None         # why the group is over, once a look found out
        self._asked_at: float | None = None   # when the look in progress began
        threading.Thread(target=self._loop, name="ftcomm-abort-watch", daemon=True).start()

    def looking(self, on: bool) -> None:
        """Starts (a collective is being waited on) or pauses the looks."""
        if on:
            self._wanted.set()
        else:
            self._wanted.clear()

    def close(self) -> None:
        """Ends the looks (the thread ends after the look in progress, if any)."""
        self._closed = True
        self._wanted.set()

    def verdict(self) -> str | None:
        """Why the group is over, in words, or None: the key was seen, the store failed, or a
        look has gone unanswered for longer than ``answer_s``. Never blocks."""
        if self._seen:
            return self._seen
        asked = self._asked_at
        if asked is not None and time.monotonic() - asked > self._answer_s:
            return f"the group's store has not answered for {self._answer_s:g} s (its rank 0 is stopped or gone)"
        return None

    def _loop(self) -> None:
        while not self._seen:
            self._wanted.wait()
            if self._closed:
                return
            self._asked_at = time.monotonic()
            try:
                if self._client.check([ABORT_KEY]):
                    self._seen = "another member aborted the group"
            except RuntimeError as error:  # the server is gone
                self._seen = f"the group's store does not answer: {error}"
            self._asked_at = None
            time.sleep(self._every_s)
