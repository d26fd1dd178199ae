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
4. Where the data plane moves device memory (NCCL; gloo takes device tensors too), the new
   parameter shards are allgathered from the device staging shard into a device buffer as long
   as the flat parameters (``gather_buffer``), which is then copied to the engine's host flat
   parameters on the side stream (``gathered_to_host``: the replicas take their wards' parameter
   slots there, and the host copy stays the committed state). Else the allgather runs on the
   host copies.
5. ``committed``: after the step's agreement the device staging shard becomes the live one, and
   ``params_from_gathered`` copies the allgathered parameters into the device parameters, device
   to device. A voided step leaves the device live shard and parameters as they were, like the
   host ones.

After a rebuild or a loaded state the engine hands its new host live shard to ``adopt``, which
copies it to the device (the newcomer's shard lands on its own device this way). The device
operations are ``device.ops``'s, so the same logic runs on CPU with a stand-in device
(tests/gpu/fake_torch_device.py).

Memory on the device: two shards and the flat shard gradient, ``(2 x slots + 1) x 4 x shard_len``
bytes, and with a data plane that moves device memory the allgather's buffer, 4 x numel bytes,
each allocated with the host copy's room for one shrink (``ftcomm/training/storage.py``), so a
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
        self.gathered: torch.Tensor | None = None  # (padded numel,), the step's allgathered parameters
        self._gathered_memory: torch.Tensor | None = None
        self.holds_committed_params = False  # whether ``gathered`` holds the last committed step's
        self._params_copied = self._state_copied = self._gathered_copied = None

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
        self.holds_committed_params = False  # the host copies are the committed state now

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
        # no marker of an earlier step may stand for this one
        self._params_copied = self._state_copied = self._gathered_copied = None
        self.holds_committed_params = False  # the step overwrites ``gathered``
        after = stepper.update(self.live, self.grad, self.staging, start, scalars)
        self._params_copied, self._state_copied = device.ops.shard_to_host(self.staging, torch.from_numpy(host_staging))
        return after

    def wait_params(self) -> None:
        """Returns once the new parameters (row 0) are in the host staging shard."""
        if self._params_copied is not None:
            device.ops.wait(self._params_copied)

    def gather_buffer(self, flat: np.ndarray) -> torch.Tensor:
        """A device buffer for the parameter allgather, as long as the engine's host flat
        parameters ``flat`` (float32 ``(padded numel,)``); allocated with ``flat``'s room for a
        shrink on first use, and again only when outgrown."""
        if self._gathered_memory is None or self._gathered_memory.numel() < flat.size:
            self.gathered = self._gathered_memory = None
            room = max(flat.size, storage.storage(flat).size)
            self._gathered_memory = device.ops.empty_on(self.device, (room,))
        self.gathered = self._gathered_memory[: flat.size]
        return self.gathered

    def gathered_to_host(self, flat: np.ndarray) -> None:
        """Starts copying ``gathered`` (the allgather just completed into it) into the engine's
        host flat parameters ``flat`` (page-locked), after the shard's copies; ``wait_state``
        waits for it."""
        self._gathered_copied = device.ops.to_host_async(self.gathered, torch.from_numpy(flat))

    def wait_state(self) -> None:
        """Returns once the whole new shard, and the allgathered parameters if they were
        gathered on the device, are in host memory (at once when no copy was started)."""
        for marker in (self._state_copied, self._gathered_copied):
            if marker is not None:
                device.ops.wait(marker)

    def committed(self) -> None:
        """The step committed: its shard becomes the live one; the parameters it allgathered on
        the device, if it did, are the committed ones (``params_from_gathered``)."""
        self.live, self.staging = self.staging, self.live
        self._memory[0], self._memory[1] = self._memory[1], self._memory[0]
        self.holds_committed_params = self._gathered_copied is not None  # this step gathered on the device

    def params_from_gathered(self) -> None:
        """The committed parameters, allgathered on the device, into the device parameters,
        device to device (``holds_committed_params`` must be true)."""
        pairs, offset = [], 0
        for p in self.params:
            pairs.append((self.gathered[offset:offset + p.numel()].view_as(p), p.data))
            offset += p.numel()
        device.ops.copy_on_device(pairs)
