"""When to checkpoint: every N committed steps, or at the Young/Daly interval from measured costs.

With ``every="auto"`` the job measures what a checkpoint costs it and what a restart from disk
costs, and checkpoints at Daly's first-order optimum (J. T. Daly, "A higher order estimate of the
optimum checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006;
J. W. Young, CACM 17(9), 1974):

    T = sqrt(2 C (M + R))     seconds of training between checkpoints

- C, the checkpoint's cost to training: the staging stall, plus what the steps lose while the
  background write runs beside them (their time above the steps' time without a write);
- M, the mean time between failures that end the whole job (``mtbf_s`` or ``FTCOMM_MTBF``): the
  ones that need the disk (a failure survived in memory rolls nothing back);
- R, a cold restart: this launch's start-up (process start to its first committed step) plus
  the time it took to load a checkpoint, if it loaded one.

T is turned into steps with the measured step time, and never below what the write needs
(a checkpoint that starts while the previous one is still being written is skipped).

Every rank measures for itself, but all must start checkpoints at the same steps: the choice is
made uniform by the agreement that completes each checkpoint, which carries each rank's proposal
as a thermometer code (bit k set for every bucket k up to the proposal's); the agreement's AND is
the smallest proposal. Buckets are powers of sqrt(2) steps: 1, 1.4, 2, ... up to 16,384 steps.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ... import settings

FIRST_BUCKET = 6      # "auto" starts every 8 steps: the first checkpoint measures the costs
BUCKETS = 29          # thermometer bits 0..28 of the agreement value (bits 2..30 of the int)
_EMA = 0.3            # weight of a new measurement


def young_daly_seconds(checkpoint_s: float, mtbf_s: float, restart_s: float) -> float:
    """Daly's first-order optimum time between checkpoints, sqrt(2 C (M + R)), in seconds."""
    return math.sqrt(2.0 * checkpoint_s * (mtbf_s + restart_s))


def bucket_of(steps: float) -> int:
    """The smallest bucket whose interval (``steps_of``) is at least ``steps``."""
    if steps <= 1:
        return 0
    return min(BUCKETS - 1, math.ceil(2 * math.log2(steps) - 1e-9))


def steps_of(bucket: int) -> int:
    return max(1, round(2 ** (bucket / 2)))


def thermometer(bucket: int) -> int:
    """Bits 0..bucket set: the AND over ranks keeps the smallest bucket."""
    return (1 << (bucket + 1)) - 1


def from_thermometer(bits: int) -> int:
    """The bucket a thermometer code (or the AND of several) stands for."""
    return max(0, (bits & ((1 << BUCKETS) - 1)).bit_length() - 1)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


@dataclass
class Costs:
    """What this rank measured, in seconds (None: not yet)."""

    stall_s: float | None = None        # staging, per checkpoint
    write_s: float | None = None        # background write, start to done
    step_s: float | None = None         # a step with no write running
    busy_step_s: float | None = None    # a step while a write runs
    startup_s: float | None = None      # process start to the first committed step of this launch
    load_s: float = 0.0                 # loading the checkpoint this launch resumed from
    warm_mttr_s: float | None = None    # the last in-memory recovery, failure to first commit

    def checkpoint_s(self, steps_per_write: float) -> float:
        """C: the stall plus the steps' loss while a write runs."""
        slowdown = max(0.0, (self.busy_step_s or 0.0) - (self.step_s or 0.0))
        return (self.stall_s or 0.0) + slowdown * steps_per_write

    @property
    def restart_s(self) -> float:
        """R: a cold restart (start-up, plus the load if this launch did one)."""
        return (self.startup_s or 0.0) + self.load_s


class Schedule:
    """Which committed steps start a checkpoint.

    Args:
        every: a number of steps (int >= 1), or "auto".
        mtbf_s: M for "auto" (default ``FTCOMM_MTBF``), seconds.

    Raises:
        ValueError: ``every`` is neither, or "auto" without an MTBF (the same on every rank).
    """

    def __init__(self, every, mtbf_s: float | None = None):
        self.auto = every == "auto"
        if self.auto:
            self.mtbf_s = mtbf_s if mtbf_s is not None else settings.mtbf()
            if self.mtbf_s is None or not self.mtbf_s > 0:
                raise ValueError('checkpoint_every="auto" needs the MTBF of the failures that end the job: '
                                 f"mtbf_s= or FTCOMM_MTBF (seconds), not {mtbf_s!r}")
            self.every, self.next_step = None, steps_of(FIRST_BUCKET)
        else:
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ValueError(f'checkpoint_every must be a number of steps >= 1 or "auto", not {every!r}')
            self.every, self.next_step, self.mtbf_s = every, every, None
        self.costs = Costs()
        self.last_choice: dict | None = None
        self.bucket = FIRST_BUCKET  # the agreed choice under "auto"
        self.last_start: int | None = None
        self._sent: dict | None = None  # the proposal this rank's bits carried

    def due(self, step: int) -> bool:
        """Whether a checkpoint is to start after committed ``step`` (the same on every rank)."""
        if not self.auto:
            return step % self.every == 0
        return step >= self.next_step

    def restart_from(self, step: int) -> None:
        """After a change of the group (or at a rank's first step): under "auto", back to the
        first choice, due at the next multiple of its interval after ``step``. Every rank, a
        promoted spare included, computes the same from the same step."""
        if self.auto:
            self.bucket, self.last_start = FIRST_BUCKET, None
            every = steps_of(self.bucket)
            self.next_step = (step // every + 1) * every

    def started(self, step: int) -> None:
        """A checkpoint started after ``step``: the next one is due one interval later."""
        self.last_start = step
        if self.auto:
            self.next_step = step + steps_of(self.bucket)

    # -- measurements ----------------------------------------------------------------------
    def note_first_commit(self) -> None:
        """This launch's first committed step: its start-up so far is a cold restart's share."""
        if self.costs.startup_s is None:
            self.costs.startup_s = process_age_s()

    def note_warm_recovery(self, seconds: float) -> None:
        """An in-memory recovery's MTTR (failure to the first commit after it): logged with the
        choices (it rolls nothing back, so it does not enter T)."""
        self.costs.warm_mttr_s = seconds

    def note_step(self, seconds: float, writing: bool) -> None:
        if writing:
            self.costs.busy_step_s = _ema(self.costs.busy_step_s, seconds)
        else:
            self.costs.step_s = _ema(self.costs.step_s, seconds)

    def note_write(self, stall_s: float, write_s: float) -> None:
        self.costs.stall_s = _ema(self.costs.stall_s, stall_s)
        self.costs.write_s = _ema(self.costs.write_s, write_s)

    def proposal(self) -> dict:
        """This rank's choice from its measurements: {"interval_s", "steps", "checkpoint_s",
        "mtbf_s", "restart_s", ...}; under a fixed interval, that interval."""
        if not self.auto:
            return {"steps": self.every}
        c, step_s = self.costs, self.costs.step_s or self.costs.busy_step_s or 1.0
        write_steps = (c.write_s or 0.0) / step_s
        checkpoint_s = c.checkpoint_s(write_steps)
        interval_s = young_daly_seconds(checkpoint_s, self.mtbf_s, c.restart_s)
        steps = max(1, math.ceil(interval_s / step_s), math.ceil(write_steps) + 1)
        return {"steps": steps, "interval_s": interval_s, "checkpoint_s": checkpoint_s, "mtbf_s": self.mtbf_s,
                "restart_s": c.restart_s, "stall_s": c.stall_s, "write_s": c.write_s, "step_s": c.step_s,
                "busy_step_s": c.busy_step_s, "warm_mttr_s": c.warm_mttr_s, "cold_mttr_s": c.restart_s}

    def proposal_bits(self) -> int:
        """This rank's proposal as agreement bits (all ones under a fixed interval)."""
        if not self.auto:
            return thermometer(BUCKETS - 1)
        # kept for adopt(): steps may be measured between the agreement's start and its end
        self._sent = self.proposal()
        return thermometer(bucket_of(self._sent["steps"]))

    def adopt(self, agreed_bits: int) -> dict | None:
        """Takes the agreed (smallest) proposal; returns the choice to log (None under a fixed
        interval)."""
        if not self.auto:
            return None
        mine = self._sent or self.proposal()
        self.bucket = from_thermometer(agreed_bits)
        self.last_choice = {**mine, "proposed_steps": mine["steps"], "steps": steps_of(self.bucket)}
        if self.last_start is not None:
            self.next_step = self.last_start + steps_of(self.bucket)
        return self.last_choice
