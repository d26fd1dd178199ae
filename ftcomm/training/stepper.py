"""One optimizer step on one shard, computed by a ``torch.optim`` optimizer.

A shard is a contiguous slice of the flattened parameters (``layout.py``); its state is a
float32 array ``(slots, shard_len)``: slot 0 the parameters, then one slot per per-element state
tensor of the optimizer (``exp_avg``, ``exp_avg_sq`` for AdamW; ``momentum_buffer`` for SGD), in
the order the optimizer creates them. Per-parameter scalars of the state (AdamW's ``step``) are
kept apart, one set per param group (every shard holds a part of every group, possibly empty,
so they advance alike on every rank).

The step is out of place: the committed state is copied to the output array and torch's own
kernels (foreach or fused where the class has them) update that copy in place, through tensors
that are views of it. So any optimizer whose update is elementwise works, and its math is
torch's, not ours. ``probe`` checks that at construction: a class that needs a closure (LBFGS),
keeps state of another shape than the parameter (Adafactor's factored moments), or whose update
of a tensor differs from the update of its two halves (a trust ratio over the whole tensor) is
refused with ``ValueError``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

# torch's first optimizer construction in a process imports torch._dynamo (about 2 s on these
# machines). Done here, at import, a spare rank pays it while it waits idle, not while the
# survivors wait for it to build its optimizer and join.
torch.optim.SGD([torch.zeros(1)])

# Names ShardedOptimizer accepts in place of a class, with the defaults ftcomm always used for them.
NAMED = {"adamw": (torch.optim.AdamW, {}), "sgd": (torch.optim.SGD, {"momentum": 0.9})}


def resolve(optimizer, defaults: dict) -> tuple[type, dict]:
    """(optimizer class, constructor keyword arguments) for a class or one of ``NAMED``.

    Raises:
        ValueError: an unknown name, or something that is not a ``torch.optim.Optimizer`` class.
    """
    if isinstance(optimizer, str):
        if optimizer not in NAMED:
            raise ValueError(f"optimizer must be one of {sorted(NAMED)} or a torch.optim.Optimizer class, "
                             f"not {optimizer!r}")
        cls, named_defaults = NAMED[optimizer]
        return cls, {**named_defaults, **defaults}
    if not (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer class, not {optimizer!r}")
    return optimizer, dict(defaults)


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class Probe:
    """What a trial run of the optimizer showed: the per-element state slots (slot 0 excluded),
    the scalars with their dtype (None: a Python number), and the class's full defaults."""

    slots: tuple
    scalars: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)


def _run_trial(cls: type, kwargs: dict, sizes: tuple, steps: int = 3):
    """Runs ``steps`` steps of ``cls`` on float32 parameters of ``sizes`` that together hold the
    same 12 values (fixed, so every rank probes alike). Returns (params, optimizer)."""
    gen = torch.Generator().manual_seed(12345)
    values = torch.randn(sum(sizes), generator=gen)
    grads = [torch.randn(sum(sizes), generator=gen) for _ in range(steps)]
    params = [t.clone() for t in values.split(sizes)]
    opt = cls([{"params": params}], **kwargs)
    for g in grads:
        for p, gp in zip(params, g.split(sizes)):
            p.grad = gp.clone()
        opt.step()
    return params, opt


def probe(cls: type, kwargs: dict) -> Probe:
    """Checks that ``cls(**kwargs)`` updates elementwise (see the module docstring).

    Raises:
        ValueError: it does not, naming the class and why.
    """
    name = class_name(cls)
    try:
        whole, opt = _run_trial(cls, kwargs, (12,))
        halves, _ = _run_trial(cls, kwargs, (5, 7))
    except Exception as exc:  # noqa: BLE001 - any failure of the trial means: cannot shard it
        raise ValueError(f"{name} cannot be sharded elementwise: a trial step failed ({type(exc).__name__}: "
                         f"{exc}); it needs a closure or non-dense state (LBFGS, SparseAdam)") from exc
    state = opt.state[whole[0]]
    slots, scalars = [], {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.shape == whole[0].shape:
            slots.append(key)
        elif isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() == 0:
            scalars[key] = value.dtype
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[key] = None
        else:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"{name} cannot be sharded elementwise: its state {key!r} is {shape}, "
                             f"not one value per parameter element (factored or whole-tensor state)")
    if not torch.allclose(whole[0], torch.cat(halves), rtol=1e-6, atol=1e-7):
        raise ValueError(f"{name} cannot be sharded elementwise: updating a tensor in two halves gives "
                         f"another result than updating it whole (its update uses whole-tensor norms)")
    defaults = {k: v for k, v in opt.defaults.items()}
    return Probe(tuple(slots), scalars, defaults)


@dataclass
class GroupRange:
    """Param group ``index`` covers flat elements [start, end); ``hyper``: its settings (lr, ...)."""

    start: int
    end: int
    hyper: dict


class ShardStepper:
    """Steps one shard with a ``torch.optim`` optimizer (see the module docstring).

    Args:
        cls, kwargs: the optimizer class and its constructor arguments (checked by ``probe``).
        groups: the param groups' flat ranges and settings, in flat order.

    Attributes:
        slots: ("param", *state slot names); name: the class's dotted name.
    """

    def __init__(self, cls: type, kwargs: dict, groups: list[GroupRange]):
        self.cls, self.kwargs = cls, dict(kwargs)
        self.probe = probe(cls, self.kwargs)
        self.slots = ("param", *self.probe.slots)
        self.name = class_name(cls)
        self.groups = groups
        # One optimizer instance whose groups and state are re-pointed at each step; placeholder
        # parameters only serve its constructor.
        self._opt = cls([{"params": [torch.zeros(1)], **g.hyper} for g in groups], **self.kwargs)
        self._scalar_devices: dict = {}  # device -> {scalar: where torch keeps it} (``_scalar_device``)

    def set_hyper(self, hypers: list[dict]) -> None:
        """Takes new settings per group (an LR scheduler changed ``lr``); ``params`` is ignored."""
        for g, hyper in zip(self.groups, hypers):
            g.hyper = {k: v for k, v in hyper.items() if k != "params"}

    def _local(self, g: GroupRange, start: int, length: int) -> slice:
        lo = min(max(g.start - start, 0), length)
        hi = min(max(g.end - start, 0), length)
        return slice(lo, max(lo, hi))

    def update(self, live, grad, out, start: int, scalars: list | None) -> list:
        """Writes into ``out`` the state after one step from ``live`` with gradient ``grad``.

        Args:
            live: float32 ``(len(slots), L)``, read only; grad: float32 ``(L,)``; out: like live.
                numpy arrays, or torch tensors on one device (CPU or CUDA: torch's kernels for
                that device do the math, on the current stream).
            start: the shard's first flat element.
            scalars: per group, the committed scalars ({name: float}), or None for a group (or
                the whole list None) before its first step: torch then creates its state as on
                its own first step.

        Returns:
            The scalars after the step (per group), to commit with ``out``.
        """
        live, grad, out = _tensor(live), _tensor(grad), _tensor(out)
        out.copy_(live)
        length = live.shape[1]
        scalars = scalars or [None] * len(self.groups)
        views, new_state = [], defaultdict(dict)
        for gi, g in enumerate(self.groups):
            part = self._local(g, start, length)
            p = out[0, part]
            p.grad = grad[part]
            if scalars[gi] is not None:
                state = new_state[p]
                for i, slot in enumerate(self.probe.slots, start=1):
                    state[slot] = out[i, part]
                for key, dtype in self.probe.scalars.items():
                    value = scalars[gi][key]
                    state[key] = value if dtype is None else torch.tensor(value, dtype=dtype,
                                                                          device=self._scalar_device(p, key))
            self._opt.param_groups[gi].update(g.hyper)
            self._opt.param_groups[gi]["params"] = [p]
            views.append((p, part))
        self._opt.state = new_state
        self._opt.step()
        after = []
        for (p, part), before in zip(views, scalars):
            state = self._opt.state[p]
            if before is None:  # torch created the state: copy it into the slots
                for i, slot in enumerate(self.probe.slots, start=1):
                    out[i, part] = state[slot]
            after.append({key: float(state[key]) for key in self.probe.scalars})
        self._opt.state = defaultdict(dict)
        return after

    def _scalar_device(self, p: torch.Tensor, key: str) -> torch.device:
        """Where torch keeps the scalar ``key`` (``step``, ASGD's ``eta``) for parameters on
        ``p``'s device: that is how its kernels expect it. On the CPU, the CPU; elsewhere learned
        once per device from a trial step there (AdamW keeps ``step`` on the CPU unless fused or
        capturable, ASGD keeps its scalars beside the parameters)."""
        if p.device.type == "cpu":
            return p.device
        if p.device not in self._scalar_devices:
            trial = torch.zeros(2, device=p.device)
            trial.grad = torch.zeros(2, device=p.device)
            opt = self.cls([{"params": [trial], **self.groups[0].hyper}], **self.kwargs)
            opt.step()
            self._scalar_devices[p.device] = {k: v.device for k, v in opt.state[trial].items()
                                              if isinstance(v, torch.Tensor) and v.dim() == 0}
        return self._scalar_devices[p.device].get(key, torch.device("cpu"))


def _tensor(a) -> torch.Tensor:
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a
