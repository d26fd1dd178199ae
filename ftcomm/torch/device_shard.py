"""A rank's shard of the optimizer state in device memory, for ``ZeroRedundancyOptimizer`` with a
model on a GPU.

The sharded engine (``ftcomm.training.ShardedOptimizer``) keeps the committed state in host
memory: that is what its buddies' replicas, the rebuild, the scrub and the state dicts work on.
With this object the update itself runs on the device, where the gradients already are:

1. ``gather_grads``: the slice of the DDP-averaged gradients that this rank's shard covers is
   copied, device to device, into one flat gradient (float32 ``(shard_len,)``).
2. ``update``: torch's kernels for the device (foreach or fused, as the optimizer class chooses)
   step the device copy of the live shard out of place into a device staging shard, on the
   current stream.
3. The result goes to the engine's host staging shard (page-locked memory) on a side stream,
   parameters first (``wait_params``: the allgather needs them) and the state slots after
   (``wait_state``: the replicas need them), so that the larger copy overlaps the allgather.
4. ``committed``: after the step's agreement the device staging shard becomes the live one. A
   voided step leaves the device live shard as it was, like the host one.

After a rebuild or a loaded state the engine hands its new host live shard to ``adopt``, which
copies it to the device (the newcomer's shard lands on its own device this way). The device
operations are ``device.ops``'s, so the same logic runs on CPU with a stand-in device
(tests/gpu/fake_torch_device.py).

Memory on the device: two shards, ``2 x slots x 4 x shard_len`` bytes, plus the flat shard
gradient ``4 x shard_len``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..training import storage
from . import device


def pin_host_memory() -> None:
    """Makes the engine allocate its shard buffers in page-locked host memory (process-wide)
    where CUDA is there; the device-to-host copies are then asynchronous."""
    if torch.cuda.is_available():
        storage.use_host_allocator(lambda n: torch.zeros(n, dtype=torch.float32, pin_memory=True).numpy())


class DeviceShard:
    """The device side of one rank's shard (see the module docstring).

    Args:
        params: the device parameters, in the engine's flat order (group after group), all on one
            device, float32.

    Raises:
        ValueError: parameters on several devices, or not float32.
    """

    def __init__(self, params: list[torch.Tensor]):
        devices = {p.device for p in params}
        if len(devices) != 1 or any(p.dtype != torch.float32 for p in params):
            raise ValueError(f"DeviceShard takes float32 parameters on one device, not {sorted(map(str, devices))} "
                             f"with dtypes {sorted({str(p.dtype) for p in params})}")
        self.params = params
        self.device = params[0].device
        self.live: torch.Tensor | None = None     # (slots, shard_len), the committed state
        self.staging: torch.Tensor | None = None  # the step in progress
        self.grad: torch.Tensor | None = None     # (shard_len,)
        self._params_copied = self._state_copied = None

    def _fit(self, buffer: torch.Tensor | None, shape: tuple) -> torch.Tensor:
        """A device tensor of ``shape``: ``buffer`` when it already has that shape."""
        if buffer is not None and tuple(buffer.shape) == tuple(shape):
            return buffer
        return device.ops.empty_on(self.device, shape)

    def adopt(self, live: np.ndarray) -> None:
        """The device live shard takes the engine's host one (float32 ``(slots, shard_len)``),
        synchronously."""
        self.live = self._fit(self.live, live.shape)
        self.staging = self._fit(self.staging, live.shape)
        self.grad = self._fit(self.grad, (live.shape[1],))
        device.ops.to_device(torch.from_numpy(live), self.live)

    def gather_grads(self, layout, rank: int) -> None:
        """The gradient of shard ``rank`` of ``layout`` (a ``ShardLayout``) into ``grad``, from the
        parameters' ``.grad`` (None counts as zero; the padding after the last element is zero)."""
        lo, hi = layout.bounds(rank)
        start = layout.start(rank)
        self.grad.zero_()
        offset = 0
        for p in self.params:
            end = offset + p.numel()
            a, b = max(offset, lo), min(end, hi)
            if a < b and p.grad is not None:
                self.grad[a - start:b - start].copy_(p.grad.reshape(-1)[a - offset:b - offset])
            offset = end

    def update(self, stepper, host_staging: np.ndarray, start: int, scalars) -> list:
        """Steps the device live shard into the device staging shard with ``grad`` (torch's
        kernels for the device), then starts its copy into ``host_staging``. Returns the new
        scalars (see ``ShardStepper.update``)."""
        after = stepper.update(self.live, self.grad, self.staging, start, scalars)
        self._params_copied, self._state_copied = device.ops.shard_to_host(self.staging, torch.from_numpy(host_staging))
        return after

    def wait_params(self) -> None:
        """Returns once the new parameters (row 0) are in the host staging shard."""
        if self._params_copied is not None:
            device.ops.wait(self._params_copied)

    def wait_state(self) -> None:
        """Returns once the whole new shard is in the host staging shard (at once when no copy
        was started)."""
        if self._state_copied is not None:
            device.ops.wait(self._state_copied)

    def committed(self) -> None:
        """The step committed: its shard becomes the live one."""
        self.live, self.staging = self.staging, self.live
