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
        self._marked: dict[int, torch.Tensor] = {}
        self._kernels: list[threading.Thread] = []
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.copy_delay = 0.02  # seconds a shard's device-to-host copy takes (shard_to_host)

    def mark(self, t: torch.Tensor) -> torch.Tensor:
        self._marked[id(t)] = t  # kept alive: ids stay unique while marked
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
        return id(t) in self._marked

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
        """As a copy on a side stream: row 0 lands ``copy_delay`` seconds after the call, the
        other rows ``copy_delay`` later, each on a thread that ``wait`` joins."""
        self._log("shard_to_host")

        def copy(rows, after):
            if after is not None:
                after.join()
            time.sleep(self.copy_delay)
            host[rows].copy_(shard[rows])
            self._log(f"copied rows {rows.start}:{rows.stop}")

        first = threading.Thread(target=copy, args=(slice(0, 1), None), daemon=True)
        first.start()
        rest = threading.Thread(target=copy, args=(slice(1, shard.shape[0]), first), daemon=True)
        rest.start()
        return [first], [rest]


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
