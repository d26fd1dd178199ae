"""A rank whose local gradient is far out of line with the others': silent corruption inside one
rank's backward (a flipped exponent bit turns a gradient of 1e-3 into 1e35), which neither the
ring's checksums (the data arrive as sent) nor the state check (the corrupted average is applied
on every rank alike) can see.

Each rank's local gradient norm rides along with DDP's gradient allreduce: a DDP comm hook
(``ddp_hook``) reduces each bucket together with one more buffer, float64[2 x W] (W the size of
MPI_COMM_WORLD, spares included, so that its length never changes, even when a recovery lands
between two ranks' hooks), zero but for this rank's world-rank slots: its squared L2 norm of the
local bucket, and a 1 that says it took part. One committed step for both, no extra message:
after the sum every rank holds every member's squared norm of that bucket, the same numbers
everywhere, so every rank reaches the same verdict without communicating.

The verdict, at ``optimizer.step()`` once every bucket is in (``GradOutlierCheck.judge``, from
the optimizer pre-hook, and only in a step no failure voided already): world
rank r is out of line when its norm (summed over the step's buckets) is not finite, or exceeds
``ratio`` times a reference: the median of the other ranks' norms this step (one bad rank cannot
move a median; with 2 ranks it is the other rank's norm), but at least the typical norm of recent
steps (the median over the last ``HISTORY`` steps of each step's median). The floor matters late
in training: with small batches a rank whose batch is already well fit has a gradient norm 100x
below another's (measured on the test job's model at batch 8: up to 77x between ranks), while
against the recent typical norm no rank went above 10x in 1,000 healthy steps at 4 ranks (27 steps
had one above 5x). The harmful flips are far out: an
exponent's top bit multiplies a value below 2 by 2^128. Default ratio 100.

What happens then (``policy``):
- ``"log"``: the event is recorded (``ftcomm.corruptions()``, stderr, the run's log) and the
  step applied as it is.
- ``"redo"``: the step is voided on every rank and redone from the same batch and RNG state: a
  transient fault is gone the second time. If the same rank is out of line again in the redone
  step, that is its data, not a fault: the step is applied and the event says so.

The recent typical norms and the redone ranks are state that every rank must hold alike: a
promoted spare receives them with the hand-over (``state_dict``). Gradient accumulation over
several iterations (``no_sync``) is not supported by the loop, and would defeat the check.
"""
from __future__ import annotations

import collections
import math
import statistics
import threading

import torch
from mpi4py import MPI

from ...core import fault
from ...core.events import CorruptionEvent, record_corruption

POLICIES = ("log", "redo")
CHECKED = "gradient norm outlier"
HISTORY = 64  # steps whose median norm set the floor of the reference


def sq_norm(tensor: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of ``tensor`` (floating point, any device) as a float64 scalar tensor on
    its device (no host sync); inf or nan when an element is. Accumulated in float32: a float64
    accumulation would first copy a float32 bucket to float64 (it made the check cost 11-16% of a
    DDP step), and float16 would overflow above 65504 (loss scaling gets there)."""
    return torch.linalg.vector_norm(tensor.detach(), dtype=torch.float32).double().square()


def outliers(norms: list[float], ratio: float, floor: float = 0.0) -> list[int]:
    """Indices of ``norms`` that are not finite or above ``ratio`` x max(the median of the
    others, ``floor``). Fewer than 2 norms: none."""
    if len(norms) < 2:
        return []
    found = []
    for i, n in enumerate(norms):
        others = [m for j, m in enumerate(norms) if j != i and math.isfinite(m)]
        reference = max(statistics.median(others) if others else 0.0, floor)
        if not math.isfinite(n) or (reference > 0 and n > ratio * reference):
            found.append(i)
    return found


class GradOutlierCheck:
    """The outlier check of one ``resilient`` loop (module docstring).

    Args:
        policy: "log" or "redo".
        ratio: a rank's gradient norm above ``ratio`` x the reference (module docstring) is out
            of line.

    Raises:
        ValueError: an unknown policy, or ``ratio`` not above 1.
    """

    def __init__(self, policy: str, ratio: float = 100.0):
        if policy not in POLICIES:
            raise ValueError(f"ftcomm.torch.resilient: grad_outliers must be one of {POLICIES} or None, not {policy!r}")
        if not ratio > 1:
            raise ValueError(f"ftcomm.torch.resilient: outlier_ratio must be > 1, not {ratio!r}")
        self.policy, self.ratio = policy, float(ratio)
        self._lock = threading.Lock()
        self.step = 0                          # the training step being run (for the events)
        self._sums: torch.Tensor | None = None  # this step's buckets, summed: [squared norms | took part]
        self._verdict = None                   # this step's (void, event), once judged
        self._redone: set[int] = set()         # world ranks whose outlier voided the current step once
        self._typical: collections.deque = collections.deque(maxlen=HISTORY)  # recent steps' median norms

    def add_bucket(self, values: torch.Tensor) -> None:
        """One bucket's reduced float64[2 x W] (module docstring), on the communication thread."""
        values = values.detach().to("cpu", torch.float64)
        with self._lock:
            self._sums = values.clone() if self._sums is None else self._sums + values

    def start_step(self, step: int) -> None:
        """A step boundary: forget the norms and the verdict; ``step`` is the training step to come."""
        with self._lock:
            self.step, self._sums, self._verdict = step, None, None

    @property
    def verdict(self) -> tuple[bool, CorruptionEvent | None] | None:
        """This step's verdict if ``judge`` was called in it, else None."""
        with self._lock:
            return self._verdict

    def state_dict(self) -> dict:
        """What a promoted spare must hold to judge as the others do."""
        with self._lock:
            return {"typical": list(self._typical), "redone": sorted(self._redone)}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._typical = collections.deque(state["typical"], maxlen=HISTORY)
            self._redone = set(state["redone"])

    def judge(self) -> tuple[bool, CorruptionEvent | None]:
        """The verdict on the current step, taken once (later calls in the same step, e.g. from a
        second optimizer, return it again): (void it, the event or None). The same on every rank:
        the norms are the allreduce's result."""
        with self._lock:
            if self._verdict is None:
                self._verdict = self._decide()
            return self._verdict

    def _decide(self) -> tuple[bool, CorruptionEvent | None]:
        if self._sums is None:
            return False, None
        world = len(self._sums) // 2
        squares, took_part = self._sums[:world].tolist(), self._sums[world:].tolist()
        members = [w for w in range(world) if took_part[w] > 0]
        norms = [math.sqrt(squares[w]) if math.isfinite(squares[w]) and squares[w] >= 0 else math.inf
                 for w in members]
        floor = statistics.median(self._typical) if self._typical else 0.0
        bad = [members[i] for i in outliers(norms, self.ratio, floor)]
        finite = [n for n in norms if math.isfinite(n)]
        if finite and not bad:
            self._typical.append(statistics.median(finite))
        if not bad:
            self._redone.clear()
            return False, None
        redo = self.policy == "redo" and not set(bad) <= self._redone
        if redo:
            self._redone.update(bad)
            action = "voided and redone"
        elif self.policy == "redo":
            self._redone.clear()
            action = "applied: out of line again in the redone step (its data, not a transient fault)"
        else:
            action = "logged, applied"
        shown = ", ".join(f"{r}: {n:.3g}" for r, n in zip(members, norms))
        event = record_corruption(CorruptionEvent(self.step, bad, "DDP gradients",
                                                  f"{CHECKED} (norm by world rank {shown}; ratio {self.ratio:g}, "
                                                  f"typical {floor:.3g})",
                                                  action))
        return redo, event


def ddp_hook(check: GradOutlierCheck, group):
    """A DDP comm hook (``DistributedDataParallel.register_comm_hook(None, hook)``) that averages
    each gradient bucket as DDP's default allreduce does (divide by the world size, sum) and sends
    this rank's squared bucket norm along in the same committed step (module docstring). ``group``:
    the ftcomm process group (``ProcessGroupFtcomm``)."""

    world = MPI.COMM_WORLD.Get_size()
    me = MPI.COMM_WORLD.Get_rank()  # the world rank: the same on every communicator, after any recovery

    def hook(_state, bucket):
        grads = bucket.buffer()
        if grads.device.type == "cpu":  # tests: a flip in this rank's local gradient (an ALU or memory fault)
            flip_exponent("gradient", me, check.step, grads)
        values = torch.zeros(2 * world, dtype=torch.float64, device=grads.device)
        values[me] = sq_norm(grads)
        values[world + me] = 1.0
        grads.div_(group.size())

        def done(fut):
            check.add_bucket(values)
            return fut.value()[0]

        return group.allreduce([grads, values]).get_future().then(done)

    return hook


def flip_exponent(point: str, world_rank: int, step: int, tensor: torch.Tensor) -> bool:
    """A bitflip point for floating-point data: if a ``kind=bitflip`` spec names ``point``, flips
    the most significant exponent bit of the middle element of ``tensor`` (a contiguous CPU
    float16/bfloat16/float32/float64 tensor, in place) once: the flip that matters (x 2^128 for a
    float32 below 2). Returns whether it flipped."""
    scratch = torch.zeros(2, dtype=torch.uint8)
    if tensor.numel() == 0 or not fault.flip(point, world_rank, step, scratch):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    top_exponent_bit = 1 << (tensor.element_size() * 8 - 2)  # below the sign bit, in every float format
    middle = tensor.view(-1).view(ints)[tensor.numel() // 2:][:1]
    middle.bitwise_xor_(torch.tensor(top_exponent_bit, dtype=ints))
    return True
