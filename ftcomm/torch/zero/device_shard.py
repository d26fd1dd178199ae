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
3. The result goes to the engine's host staging shard (page-locked memory, ``host_zeros``) on a
   side stream, parameters first (``wait_params``: the allgather needs them) and the state slots
   after (``wait_state``: the replicas need them), so that the larger copy overlaps the allgather.
4. ``committed``: after the step's agreement the device staging shard becomes the live one. A
   voided step leaves the device live shard as it was, like the host one.

After a rebuild or a loaded state the engine hands its new host live shard to ``adopt``, which
copies it to the device (the newcomer's shard lands on its own device this way). The device
operations are ``device.ops``'s, so the same logic runs on CPU with a stand-in device
(tests/gpu/fake_torch_device.py).

Memory on the device: two shards and the flat shard gradient, ``(2 x slots + 1) x 4 x shard_len``
bytes, allocated with the host shard's room for one shrink (``ftcomm/training/storage.py``), so a
first shrink allocates nothing there either. Page-locked host memory: the live and staging shards
and the flat parameters (not the replicas, which never meet the device); torch's page-locked
allocator may round each of these up to a power of two.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...training import storage
from ..group import device


def _pinned_zeros(n: int, used: int | None = None) -> np.ndarray:
    return torch.zeros(n, dtype=torch.float32, pin_memory=True).numpy()  # the tensor stays the array's base


class DeviceShard:
    """The device side of one rank's shard (see the module docstring).

    Args:
        params: the device parameters, in the engine's flat order (group after group), all on one
            device, float32.

    Attributes:
        host_zeros: the allocator of page-locked host memory the engine takes for the buffers these
            copies touch (None where there is no CUDA: the stand-in device of the tests).

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
        self.host_zeros = _pinned_zeros if torch.cuda.is_available() else None
        self.live: torch.Tensor | None = None     # (slots, shard_len), the committed state
        self.staging: torch.Tensor | None = None  # the step in progress
        self.grad: torch.Tensor | None = None     # (shard_len,)
        self._memory: list[torch.Tensor] = []     # 1-D device buffers under live, staging, grad
        self._params_copied = self._state_copied = None

    def adopt(self, live: np.ndarray) -> None:
        """The device live shard takes the engine's host one (float32 ``(slots, shard_len)``),
        synchronously. Device memory is allocated only when the shard outgrew it, after the old
        buffers were let go (the host shard is the committed state)."""
        slots, length = live.shape
        room = max(live.size, storage.storage(live).size)  # the host shard's room for a shrink
        if not self._memory or self._memory[0].numel() < live.size or self._memory[2].numel() < length:
            self.live = self.staging = self.grad = None
            self._memory = []
            self._memory = [device.ops.empty_on(self.device, (n,)) for n in (room, room, math.ceil(room / slots))]
        self.live = self._memory[0][: live.size].view(slots, length)
        self.staging = self._memory[1][: live.size].view(slots, length)
        self.grad = self._memory[2][:length]
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
        self._params_copied = self._state_copied = None  # no marker of an earlier step may stand for this one
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
        self._memory[0], self._memory[1] = self._memory[1], self._memory[0]
