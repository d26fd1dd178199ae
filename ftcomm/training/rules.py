"""Update rules of ``ShardedOptimizer``: SGD and AdamW written out of place on one shard, as
float32 torch views of numpy memory, so that the committed shard stays untouched until the step
commits. Each matches its torch.optim class step for step (tests/unit/test_sharding.py).
"""
from __future__ import annotations

import math

import torch


class SGD:
    """SGD with momentum, weight decay and Nesterov, as torch.optim.SGD (dampening 0).

    Slots: param, momentum_buffer.
    """

    name = "sgd"

    def __init__(self, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False):
        self.lr, self.momentum, self.weight_decay, self.nesterov = lr, momentum, weight_decay, nesterov
        self.slots = ("param", "momentum_buffer") if momentum else ("param",)

    def update(self, live, grad, out, t: int) -> None:
        """Writes the state after update number ``t`` (1-based) into ``out``; ``live`` and
        ``grad`` are read only. All tensors: float32, shape (shard_len,) per slot."""
        p, new_p = live[0], out[0]
        g = grad.add(p, alpha=self.weight_decay) if self.weight_decay else grad
        if self.momentum:
            buf, new_buf = live[1], out[1]
            if t == 1:
                new_buf.copy_(g)  # torch.optim.SGD starts the buffer at the first gradient
            else:
                torch.mul(buf, self.momentum, out=new_buf).add_(g)
            g = g.add(new_buf, alpha=self.momentum) if self.nesterov else new_buf
        torch.add(p, g, alpha=-self.lr, out=new_p)


class AdamW:
    """AdamW (Loshchilov & Hutter, ICLR'19) with bias correction, as torch.optim.AdamW.

    Slots: param, exp_avg, exp_avg_sq. The step count t is the number of committed steps.
    """

    name = "adamw"
    slots = ("param", "exp_avg", "exp_avg_sq")

    def __init__(self, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay

    def update(self, live, grad, out, t: int) -> None:
        """As SGD.update."""
        (p, m, v), (new_p, new_m, new_v) = live, out
        b1, b2 = self.betas
        torch.mul(p, 1.0 - self.lr * self.weight_decay, out=new_p)
        torch.lerp(m, grad, 1.0 - b1, out=new_m)
        torch.mul(v, b2, out=new_v).addcmul_(grad, grad, value=1.0 - b2)
        denom = new_v.sqrt().div_(math.sqrt(1.0 - b2 ** t)).add_(self.eps)
        new_p.addcdiv_(new_m, denom, value=-self.lr / (1.0 - b1 ** t))


RULES = {"sgd": SGD, "adamw": AdamW}


def make_rule(name: str, lr: float, **hyper):
    """The update rule called ``name`` ("sgd" or "adamw").

    Raises:
        ValueError: unknown name.
    """
    if name not in RULES:
        raise ValueError(f"optimizer must be one of {sorted(RULES)}, not {name!r}")
    return RULES[name](lr, **hyper)
