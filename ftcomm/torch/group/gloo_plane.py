"""The gloo data plane: a resilient step's gradient buckets and ZeRO's parameter allgather
through an inner torch gloo group (``inner_group.py``: its rendezvous, watching and abort).

gloo fails a collective at once when a peer's connection closes: a dead rank's, a stopped rank's
once ftcomm fences it, and a member's that gave up on the group. Dropping the group closes this
rank's connections, which is how a rank aborts it here: ``ProcessGroupGloo.abort()`` does not
interrupt a collective in progress (torch 2.13 and 2.15, checked here: a collective waiting on a
stopped peer ran to gloo's own timeout after it). Its destructor waits for such a collective too,
so the group is released on a thread of its own (``inner_group.py``). CUDA tensors are taken as
they are (gloo copies them through host memory itself, one tensor per collective), and so are
the parameter shards of a ZeRO model on a GPU.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from .device import is_device
from .inner_group import REDUCE_OPS, InnerGroupPlane
from .lifetime import deadline

# Seconds gloo's own timeout of a collective runs past ftcomm's deadline: ftcomm's comes first, so
# that the control plane judges who kept the collective waiting (and fences a hung rank at once);
# gloo's ends soon after a collective that was left running on a peer that is neither dead nor fenced.
_GLOO_MARGIN = 5.0


class GlooPlane(InnerGroupPlane):
    """An inner ``ProcessGroupGloo`` over the ranks of the communicator it is given, made on first
    use and again for each new communicator (after a recovery)."""

    name = "gloo"
    # gloo's wait wakes at once when the collective ends, so longer waits cost nothing; it counts
    # whole milliseconds, and 0 means no timeout at all.
    first_pause, longest_pause = 1e-3, 0.05

    def _make_group(self, store, rank: int, size: int, timeout: float, device):
        return dist.ProcessGroupGloo(store, rank, size, deadline(timeout))

    def _start_allgather(self, group, out, inp, timeout):
        opts = _c10d.AllgatherOptions()
        opts.timeout = deadline(timeout + _GLOO_MARGIN)
        return group._allgather_base(out, inp, opts)

    def _start_allreduce(self, group, tensors, op: str, timeout) -> list:
        if any(is_device(t) for t in tensors):  # gloo's CUDA allreduce takes one tensor at a time
            opts = _options(dist.AllreduceOptions(), op, timeout)
            return [group.allreduce([t], opts) for t in tensors]
        if len(tensors) == 1:
            return [group.allreduce(list(tensors), _options(dist.AllreduceOptions(), op, timeout))]
        return [group.allreduce_coalesced(list(tensors), _options(dist.AllreduceCoalescedOptions(), op, timeout))]

    def _ended_within(self, work, seconds: float) -> bool:
        try:
            return bool(work.wait(datetime.timedelta(seconds=seconds)))
        except RuntimeError:
            return work.is_completed()  # failed, or only this wait timed out

    def _abort_group(self, group) -> None:
        """Nothing to call: dropping the last reference closes the connections."""


def _options(opts, op: str, timeout):
    opts.reduceOp = REDUCE_OPS[op]
    opts.timeout = deadline(timeout + _GLOO_MARGIN)
    return opts
