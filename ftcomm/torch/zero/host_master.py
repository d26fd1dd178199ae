"""Host master copies of parameters that live on a GPU, for ``ZeroRedundancyOptimizer``.

The sharded engine (``ftcomm.training.ShardedOptimizer``) keeps the parameters in one flat host
buffer, its shards and their replicas in host memory. For a model on a GPU, the optimizer gives
the engine host tensors that stand for the device parameters (their master copies). The shard is
then updated on the device (``device_shard.py``: the default when every parameter is on one
device), or, with ``offload=True``, on the CPU as ZeRO-Offload does (Ren et al., USENIX ATC'21:
at each step the gradients go device to host and torch's CPU kernels update the shard). Either
way the committed parameters go host to device after each step. The device parameters are
written only after a step committed or a rebuild finished, so a voided step leaves them bitwise
as they were, as the backend's collectives do (``device.py``).
"""
from __future__ import annotations

import torch

from ..group import device


class HostMaster:
    """The engine's view of ``groups`` (param groups, as torch optimizers take them): each device
    parameter replaced by a float32 host tensor that requires grad, initialised from it.

    Attributes:
        groups: the param groups to give the engine.
        on_device: True when some parameter lives on a device.
    """

    def __init__(self, groups: list[dict]):
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device parameter, host master)
        self.groups = []
        for group in groups:
            params = []
            for p in group["params"]:
                if device.is_device(p):
                    host = device.ops.to_host(p.detach(), copy=True).requires_grad_(p.requires_grad)
                    self._pairs.append((p, host))
                    params.append(host)
                else:
                    params.append(p)
            self.groups.append(dict(group, params=params))
        self.on_device = bool(self._pairs)
        # every parameter on one device: the shard can then be updated there (device_shard.py)
        self.one_device = self.on_device and len(self._pairs) == sum(len(g["params"]) for g in groups) \
            and len({p.device for p, _ in self._pairs}) == 1

    @property
    def device_params(self) -> list[torch.Tensor]:
        """The device parameters, in the engine's flat order."""
        return [p for p, _ in self._pairs]

    def grads_to_host(self) -> None:
        """Each master's ``.grad`` = its device parameter's (None stays None)."""
        for p, host in self._pairs:
            host.grad = None if p.grad is None else device.ops.to_host(p.grad, copy=True)

    def params_from_device(self) -> None:
        """The device parameters' values into the masters (after a load into the model)."""
        with torch.no_grad():
            for p, host in self._pairs:
                host.copy_(p.detach())

    def params_to_device(self) -> None:
        """The masters' values (the engine's committed parameters) into the device parameters,
        synchronised."""
        if self._pairs:
            device.ops.copy_back([(host.detach(), p.data) for p, host in self._pairs])
