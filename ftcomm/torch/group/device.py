"""CUDA tensors in the backend's collectives: stream order, and staging through host memory.

The PyPI Open MPI cannot take device pointers, so a collective on CUDA tensors runs on host
copies of them (docs/GPU.md). Three rules make that behave as torch's own backends do:

1. Order. The calling thread records a CUDA event on each device's current stream when the
   collective is issued (``Staging.__init__``); the communication thread waits for those events
   before it reads the tensors. So the collective sees what the kernels queued before it wrote,
   and the calling thread does not block.
2. Commit. The collective runs on the host copies; the results are copied back into the tensors
   only when it succeeded (``copy_back``). A collective that failed, or a step voided by a
   failure, leaves every survivor's device tensors bitwise as they were.
3. Completion. The copy back is synchronised before the Work's future completes, and the future
   is made with the tensors' devices (``devices``), so ``Work.wait()`` makes the caller's current
   stream wait for it as ``torch.futures.Future`` does for CUDA values, without blocking the host
   longer than the collective itself.

The device operations go through ``ops`` (``CudaOps`` by default), so the same logic runs on
machines without a GPU with host tensors standing in for device ones (``use_ops_for_tests``,
tests/gpu/fake_torch_device.py).
"""
from __future__ import annotations

import torch


class CudaOps:
    """The device operations staging needs, on CUDA."""

    def __init__(self):
        self._side_streams: dict = {}  # device -> the stream that copies shards to the host

    def is_device(self, t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    def ready_marker(self, tensors: list) -> list:
        """Events recorded now on the current stream of each device of ``tensors`` (calling
        thread)."""
        events = []
        for device in self.devices(tensors):
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return events

    def wait(self, marker: list) -> None:
        """Blocks until the work queued before ``marker`` is done (communication thread)."""
        for event in marker:
            event.synchronize()

    def to_host(self, t: torch.Tensor, copy: bool) -> torch.Tensor:
        """A pinned host tensor like ``t``, holding ``t``'s values when ``copy`` (synchronous)."""
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if copy:
            host.copy_(t)
        return host

    def copy_back(self, pairs: list) -> None:
        """Copies each (host, device tensor) pair into the device tensor and waits for the copies."""
        streams = set()
        for host, t in pairs:
            with torch.cuda.device(t.device):
                t.copy_(host, non_blocking=True)
                streams.add(torch.cuda.current_stream(t.device))
        for stream in streams:
            stream.synchronize()

    # -- for a shard of optimizer state in device memory (device_shard.py) ----------------------
    def empty_on(self, dev: torch.device, shape: tuple) -> torch.Tensor:
        """An uninitialised float32 tensor of ``shape`` on ``dev``."""
        return torch.empty(shape, dtype=torch.float32, device=dev)

    def to_device(self, host: torch.Tensor, t: torch.Tensor) -> None:
        """Copies ``host`` into the device tensor ``t`` and waits for the copy."""
        with torch.cuda.device(t.device):
            t.copy_(host, non_blocking=True)
            torch.cuda.current_stream(t.device).synchronize()

    def shard_to_host(self, shard: torch.Tensor, host: torch.Tensor) -> tuple:
        """Starts copying the device ``shard`` (slots, L) into ``host`` (page-locked, same shape)
        on a side stream, after the work queued so far on the current stream: row 0 first, then
        the rest. Returns (marker of row 0, marker of the rest) for ``wait``."""
        return self.to_host_async(shard[0], host[0]), self.to_host_async(shard[1:], host[1:])

    def to_host_async(self, t: torch.Tensor, host: torch.Tensor) -> list:
        """Starts copying the device tensor ``t`` into ``host`` (page-locked, same shape) on this
        device's side stream, after the work queued so far on the current stream, and after the
        copies started on the side stream before it. Returns a marker for ``wait``."""
        dev = t.device
        with torch.cuda.device(dev):
            side = self._side_stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                host.copy_(t, non_blocking=True)
                done = torch.cuda.Event()
                done.record(side)
            t.record_stream(side)  # the caching allocator must not reuse it before the copy ends
        return [done]

    def copy_on_device(self, pairs: list) -> None:
        """Copies each (source, destination) pair of tensors on one device, on the current
        stream: the kernels queued after it see the copy, and the host does not wait for it."""
        for src, dst in pairs:
            with torch.cuda.device(dst.device):
                dst.copy_(src, non_blocking=True)

    def _side_stream(self, dev: torch.device):
        if dev not in self._side_streams:
            self._side_streams[dev] = torch.cuda.Stream(dev)
        return self._side_streams[dev]

    def devices(self, tensors: list) -> list:
        """The distinct CUDA devices of ``tensors``, in first-seen order."""
        seen = []
        for t in tensors:
            if self.is_device(t) and t.device not in seen:
                seen.append(t.device)
        return seen

    def future_devices(self, tensors: list) -> list:
        """Devices for ``torch.futures.Future(devices=...)``."""
        return self.devices(tensors)


ops = CudaOps()


def use_ops_for_tests(replacement) -> CudaOps:
    """Test hook: replaces the device operations (a stand-in that treats some host tensors as
    device tensors). Returns the previous ones."""
    global ops
    previous, ops = ops, replacement
    return previous


def is_device(t: torch.Tensor) -> bool:
    return ops.is_device(t)


class Staging:
    """The host side of one collective: what it reads and writes, in host memory.

    Args:
        inputs: tensors the collective reads (not written).
        outputs: tensors it writes whole (their values before it are not needed).
        inout: tensors it reads and writes in place (allreduce, broadcast).

        copy: False when the collective takes the device tensors as they are (a data plane that
            moves device memory, ``data_plane.py``): only the order (rule 1) and the completion
            (rule 3) remain; the results are written in place whether or not it succeeds.

    ``host(t)`` is the tensor the collective works on: ``t`` itself for a host tensor (and for
    every tensor without ``copy``), a host copy for a device tensor. Made on the calling thread (it
    records the ready marker there).
    """

    def __init__(self, inputs=(), outputs=(), inout=(), copy: bool = True):
        self._inputs, self._outputs, self._inout = list(inputs), list(outputs), list(inout)
        every = self._inputs + self._outputs + self._inout
        self.on_device = any(ops.is_device(t) for t in every)
        self._copy = copy
        self._marker = ops.ready_marker(every) if self.on_device else None
        self._host: dict[int, torch.Tensor] = {}
        self._devices = ops.future_devices(every) if self.on_device else []

    @property
    def devices(self) -> list:
        """The devices for the Work's future (empty for host tensors)."""
        return self._devices

    def stage_in(self) -> None:
        """Waits for the ready marker, then makes the host copies (communication thread)."""
        if not self.on_device:
            return
        ops.wait(self._marker)
        if not self._copy:
            return
        for t in self._inputs + self._inout:
            if ops.is_device(t):
                self._host[id(t)] = ops.to_host(t, copy=True)
        for t in self._outputs:
            if ops.is_device(t) and id(t) not in self._host:
                self._host[id(t)] = ops.to_host(t, copy=False)

    def host(self, t: torch.Tensor) -> torch.Tensor:
        return self._host.get(id(t), t)

    def copy_back(self) -> None:
        """After the collective succeeded: the results into the device tensors, synchronised."""
        if self.on_device and self._copy:
            ops.copy_back([(self._host[id(t)], t) for t in self._outputs + self._inout if ops.is_device(t)])
