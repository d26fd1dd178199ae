"""The Work object every ftcomm process-group collective returns.

A collective is queued on ftcomm's communication thread (see ``executor.py``); its Work wraps a
``torch.futures.Future`` that the thread completes. ``wait()`` blocks on that future and raises
the collective's error, if any; ``get_future()`` gives the future itself, whose value is the list
of output tensors (what DDP and communication hooks expect).
"""
from __future__ import annotations

import datetime

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
        self._future = future
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
        self._future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        """The future of this collective; its value is the list of output tensors."""
        return self._future

    def is_completed(self) -> bool:
        """True once the collective finished (successfully or not)."""
        return self._future.done()

    def is_success(self) -> bool:
        """True once the collective finished without error."""
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - any error means "not a success"
            return False
        return True

    def exception(self):
        """The collective's error, or None (also None while it is still running)."""
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    def result(self) -> list:
        """The output tensors (waits first). Raises the collective's error, if any."""
        return self._future.wait()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<ftcomm.torch.FtWork {self._op_name} {state}>"


def completed_work(tensors, op_name: str) -> FtWork:
    """A Work that is already complete with ``tensors`` (for collectives with nothing to do)."""
    fut = make_future()
    fut.set_result(list(tensors))
    return FtWork(fut, op_name)
