"""The Work object every ftcomm process-group collective returns.

A collective is queued on ftcomm's communication thread (see ``executor.py``); its Work wraps a
``torch.futures.Future`` that the thread completes. ``wait()`` blocks on that future and raises
the collective's error, if any; ``get_future()`` gives a future whose value is the list of output
tensors (what DDP and communication hooks expect).

Two futures, because of how torch's Python ``Future.set_exception`` works: it stores the exception
as the future's *value* and raises it only in Python's ``wait()``. C++ readers such as DDP's
reducer see a completed future holding an exception object instead of tensors (and crashed on
it). So ``get_future()`` returns ``source.then(value)``: a callback that raises marks the derived
future with a real error, which DDP's C++ ``wait()`` turns into a RuntimeError carrying the
message; ``wait()`` itself waits on the source and raises the ftcomm exception with its type.
"""
from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist


def make_future(devices=None) -> torch.futures.Future:
    """A fresh future. ``devices``: the CUDA devices of the result tensors (a CUDA path passes
    them so that waiting synchronises streams); None or empty for CPU tensors."""
    if devices:
        return torch.futures.Future(devices=list(devices))
    return torch.futures.Future()


class FtWork(dist._Work):
    """Handle of one queued ftcomm collective.

    Args:
        future: completed by the communication thread with the list of output tensors, or with
            the exception the collective raised (an ``ftcomm.FtError`` subclass, or
            ``NotImplementedError`` / ``ValueError`` for unsupported input).
        op_name: the collective's name, for ``repr``.
    """

    def __init__(self, future: torch.futures.Future, op_name: str):
        super().__init__()
        self._source = future
        self._future = future.then(_value)  # an error here is one that C++ readers see
        self._op_name = op_name

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Blocks until the collective is done. Returns True.

        ``timeout`` is accepted for API compatibility and ignored: every ftcomm collective runs
        under its own deadline (the process group's timeout) and fails with
        ``ftcomm.CollectiveTimeoutError`` past it.

        Raises:
            ftcomm.FtError: the collective failed (for example ``ProcFailedError`` outside a
                resilient step, see ``ftcomm.torch.resilient``).
        """
        self._source.wait()  # raises the ftcomm error with its type
        self._future.wait()  # the derived future completes just after the source
        return True

    def get_future(self) -> torch.futures.Future:
        """The future of this collective; its value is the list of output tensors. If the
        collective failed, waiting on it raises (a RuntimeError with the error's message: the
        original exception type does not survive torch's C++ futures; ``wait()`` keeps it)."""
        return self._future

    def is_completed(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._source.done()

    def is_success(self) -> bool:
        """True once the collective finished without error."""
        return self._source.done() and self.exception() is None

    def exception(self):
        """The collective's error, or None (also None while it is still running)."""
        if not self._source.done():
            return None
        try:
            self._source.value()
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    def result(self) -> list:
        """The output tensors (waits first). Raises the collective's error, if any."""
        return self._source.wait()

    def __repr__(self) -> str:
        state = "done" if self._source.done() else "pending"
        return f"<ftcomm.torch.FtWork {self._op_name} {state}>"


def _value(future: torch.futures.Future):
    return future.value()  # raises the collective's error: the derived future holds it as one


def completed_work(tensors, op_name: str) -> FtWork:
    """A Work that is already complete with ``tensors`` (for collectives with nothing to do)."""
    fut = make_future()
    fut.set_result(list(tensors))
    return FtWork(fut, op_name)


def joined_work(works: list[FtWork], outputs, op_name: str) -> FtWork:
    """One Work for several queued ones (a coalesced call): complete with ``outputs`` when every
    one is, or failed with the error of the first that failed, its type kept (``then`` and
    ``collect_all`` would turn it into a RuntimeError)."""
    if not works:
        return completed_work(outputs, op_name)
    joined = make_future()
    sources = [w._source for w in works]
    remaining = [len(sources)]
    lock = threading.Lock()

    def one_done(_future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        errors = [w.exception() for w in works]
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            joined.set_exception(failed)
        else:
            joined.set_result(list(outputs))

    for source in sources:
        source.add_done_callback(one_done)
    return FtWork(joined, op_name)
