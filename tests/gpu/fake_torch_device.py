"""A stand-in for CUDA under the torch backend's staging (ftcomm/torch/group/device.py), so that its
logic runs on machines without a GPU: host tensors marked with ``mark`` count as device tensors,
and a stream is modelled by the work queued on it. ``launch(fn, delay)`` is a kernel: it runs
``fn`` on a thread after ``delay`` seconds, as a kernel runs on the GPU after the host queued it;
``ready_marker`` captures the kernels queued so far, ``wait`` waits for them. Every call is
logged in ``events`` so that tests can check the order (wait before copy-in, copy-back only
after success)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch


class FakeTorchDevice:
    def __init__(self):
        self._marked: dict[int, torch.Tensor] = {}  # by id, kept alive: ids stay unique while marked
        self._marked_memory: set[int] = set()  # data pointers of their storages
        self._kernels: list[threading.Thread] = []
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.copy_delay = 0.02  # seconds a shard's device-to-host copy takes (shard_to_host)
        self._side_stream_tail: list[threading.Thread] = []  # the last copy started: the next waits for it

    def mark(self, t: torch.Tensor) -> torch.Tensor:
        self._marked[id(t)] = t
        if t.untyped_storage().nbytes():
            self._marked_memory.add(t.untyped_storage().data_ptr())
        return t

    def launch(self, fn, delay: float) -> None:
        def kernel():
            time.sleep(delay)
            fn()
            self._log("kernel done")

        thread = threading.Thread(target=kernel, daemon=True)
        thread.start()
        self._kernels.append(thread)

    def _log(self, what: str) -> None:
        with self._lock:
            self.events.append(what)

    # -- the operations ftcomm.torch.group.device calls ------------------------------------------
    def is_device(self, t: torch.Tensor) -> bool:
        """A marked tensor, or a view of one's memory (as a view of a CUDA tensor is on the device)."""
        return id(t) in self._marked or (t.untyped_storage().nbytes() > 0
                                         and t.untyped_storage().data_ptr() in self._marked_memory)

    def ready_marker(self, tensors: list) -> list:
        self._log("marker")
        return list(self._kernels)

    def wait(self, marker: list) -> None:
        for kernel in marker:
            kernel.join()
        self._log("wait")

    def to_host(self, t: torch.Tensor, copy: bool) -> torch.Tensor:
        self._log("to_host")
        host = torch.empty(t.shape, dtype=t.dtype)  # contiguous, as CudaOps's pinned copies
        if copy:
            host.copy_(t)
        return host

    def copy_back(self, pairs: list) -> None:
        self._log("copy_back")
        for host, t in pairs:
            t.copy_(host)

    def future_devices(self, tensors: list) -> list:
        return []  # host tensors: a plain future

    # -- a shard of optimizer state on the device (ftcomm/torch/zero/device_shard.py) ---------------
    def empty_on(self, dev, shape: tuple) -> torch.Tensor:
        self._log("empty_on")
        return self.mark(torch.empty(shape, dtype=torch.float32))

    def to_device(self, host: torch.Tensor, t: torch.Tensor) -> None:
        self._log("to_device")
        t.copy_(host)

    def shard_to_host(self, shard: torch.Tensor, host: torch.Tensor) -> tuple:
        """As a copy on a side stream: row 0 lands ``copy_delay`` seconds after the copies started
        before it, the other rows ``copy_delay`` later, each on a thread that ``wait`` joins."""
        self._log("shard_to_host")
        first = self._copy_later(shard[0], host[0], "copied rows 0:1")
        return first, self._copy_later(shard[1:], host[1:], f"copied rows 1:{shard.shape[0]}")

    def to_host_async(self, t: torch.Tensor, host: torch.Tensor) -> list:
        """A copy on the side stream that lands as late as a stream may let it: when it is waited
        for, or when a copy started after it needs it, so that a missing ``wait`` reads the old
        values."""
        self._log("to_host_async")
        self._side_stream_tail = [_CopyWhenWaited(self._queued_copy(t, host, "copied to the host", 0.0))]
        return self._side_stream_tail

    def copy_on_device(self, pairs: list) -> None:
        self._log("copy_on_device")
        for src, dst in pairs:
            dst.copy_(src)

    def _copy_later(self, t, host, what: str) -> list:
        """``host.copy_(t)`` on a thread, ``copy_delay`` seconds after the copy started before it
        has landed (one side stream, in order)."""
        thread = threading.Thread(target=self._queued_copy(t, host, what, self.copy_delay), daemon=True)
        thread.start()
        self._side_stream_tail = [thread]
        return [thread]

    def _queued_copy(self, t, host, what: str, delay: float):
        """The copy of ``t`` into ``host`` queued on the side stream now: it lands ``delay``
        seconds after the copy queued before it has landed."""
        after = self._side_stream_tail

        def copy():
            for earlier in after:
                earlier.join()
            time.sleep(delay)
            host.copy_(t)
            self._log(what)

        return copy


class _CopyWhenWaited:
    """A copy that runs at its first ``join`` (a marker ``wait`` joins)."""

    def __init__(self, copy):
        self._copy, self._lock, self._done = copy, threading.Lock(), False

    def join(self) -> None:
        with self._lock:
            if not self._done:
                self._copy()
                self._done = True


@contextmanager
def installed():
    """A ``FakeTorchDevice`` as the torch backend's device operations for the body of the
    ``with``, the previous ones after it."""
    from ftcomm.torch.group import device

    stand_in = FakeTorchDevice()
    previous = device.use_ops_for_tests(stand_in)
    try:
        yield stand_in
    finally:
        device.use_ops_for_tests(previous)
