"""The elastic driver's JSON-lines event log: one JSON object per line, per rank.

Every line has ``event`` (its kind), ``time`` (Unix seconds) and ``rank`` (the world rank). The
kinds: ``start`` (step, world_size, total_steps, policy, replicas) when ``run`` begins on a rank;
``commit`` (step, world_size and the step's phase times in seconds: ``allreduce_s``,
``update_s``, ``allgather_s``, ``replicate_s``, ``agree_s``) for every committed step;
``recovered`` and ``joined`` carry the fields of ``ftcomm.RecoveryEvent``; ``first_commit``
(step, world_size) marks the first step committed after a recovery; ``state_lost``,
``disk_restore``, ``checkpoint`` and ``checkpoint_failed`` the disk fallback; ``end`` (steps,
failures, world_size) when ``run`` returns. ``ftcomm-report`` (``ftcomm.goodput``) reads them.
"""
from __future__ import annotations

import json
import os
import time

from tqdm import tqdm


class EventLog:
    """JSON-lines event log: every rank appends to ``path`` (``{rank}`` in it is replaced by the
    world rank); rank 0 also prints each line through tqdm.write (it keeps the bar intact)."""

    def __init__(self, path: str | None, world_rank: int, echo: bool):
        self.path = path.replace("{rank}", str(world_rank)) if path else None
        self.world_rank, self.echo = world_rank, echo
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def __call__(self, **event) -> dict:
        """Writes one event (and echoes it on rank 0). Returns it, with ``time`` and ``rank``."""
        return self._write(event, self.echo)

    def record(self, **event) -> dict:
        """As calling the log, never echoed: for the frequent events (one per step)."""
        return self._write(event, False)

    def _write(self, event: dict, echo: bool) -> dict:
        event = {"time": time.time(), "rank": self.world_rank, **event}
        line = json.dumps(event)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")
        if echo:
            tqdm.write(line)
        return event
