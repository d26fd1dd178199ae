"""The elastic driver's JSON-lines event log: one JSON object per line, per rank.

Every line has ``event`` (its kind), ``time`` (Unix seconds) and ``rank`` (the world rank). The
kinds: ``recovered`` and ``joined`` carry the fields of ``ftcomm.RecoveryEvent``;
``first_commit`` (step, world_size) marks the first step committed after a recovery;
``state_lost``, ``disk_restore``, ``checkpoint`` and ``checkpoint_failed`` the disk fallback.
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
        event = {"time": time.time(), "rank": self.world_rank, **event}
        line = json.dumps(event)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")
        if self.echo:
            tqdm.write(line)
        return event
