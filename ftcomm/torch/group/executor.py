"""ftcomm's communication thread for the torch backend.

Every collective of every ftcomm process group in this process runs on one thread, in the order
the collectives were issued. One thread keeps the order of collectives the same on every rank
(the program order, which torch.distributed already requires), lets DDP's backward pass go on
computing while a bucket is being reduced (the core releases the GIL), and means MPI is called
from one thread at a time. ``FTCOMM_TORCH_ASYNC=0`` runs each collective inline in the caller's
thread instead (for debugging).

A collective on an inner data-plane group (``inner_group.py``) may be started from the caller's
thread instead, when nothing is queued before it (``collectives_queued() == 0``): its start order
is then still the program order. Only the watch of it (``submit(fn, watch=True)``: a callable that
starts no collective and touches no communicator's step ids) runs here, off the bucket's path.
"""
from __future__ import annotations

import atexit
import queue
import threading

from ... import settings


class Executor:
    """A FIFO of callables run on one daemon thread (started on first use)."""

    def __init__(self, inline: bool = False):
        self.inline = inline
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending = 0
        self._collectives = 0  # the pending callables that are not watches
        self._cond = threading.Condition()
        self._start_lock = threading.Lock()

    def submit(self, fn, watch: bool = False) -> None:
        """Runs ``fn()`` after every callable submitted before it. ``fn`` must not raise (it
        reports its outcome through its own future). ``watch``: ``fn`` only watches a collective
        already started, and is not counted by ``collectives_queued``."""
        if self.inline or threading.current_thread() is self._thread:
            fn()
            return
        with self._cond:
            self._pending += 1
            self._collectives += not watch
        self._ensure_thread()
        self._queue.put((fn, watch))

    def collectives_queued(self) -> int:
        """The submitted callables, watches aside, that have not finished yet (0 inline)."""
        with self._cond:
            return self._collectives

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until every submitted callable has run. Returns False if ``timeout`` seconds
        passed first."""
        if self.inline or threading.current_thread() is self._thread:
            return True
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name="ftcomm-torch-comm", daemon=True)
                thread.start()
                self._thread = thread

    def _loop(self) -> None:
        while True:
            fn, watch = self._queue.get()
            try:
                fn()
            finally:
                with self._cond:
                    self._pending -= 1
                    self._collectives -= not watch
                    self._cond.notify_all()


EXECUTOR = Executor(inline=not settings.torch_async())


@atexit.register
def _drain_at_exit() -> None:
    # Runs before ftcomm's own atexit (registered earlier, so run later), which finalizes MPI:
    # let queued collectives finish first, but never hang the exit for long.
    EXECUTOR.drain(timeout=10.0)
