"""The exit reports ranks leave in the run directory (``ftcomm.core.runtime``), read by
``ftcomm-run`` to tell a recovered job from a failed one.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_reports(run_dir: str) -> list[dict]:
    """The exit reports that ranks left in the run directory."""
    return [json.loads(path.read_text()) for path in Path(run_dir).glob("rank*.json")]


def summarize(run_dir: str, world_size: int, reports=None) -> tuple[list[int], list[int]]:
    """(finished world ranks, lost world ranks) from the ranks' exit reports."""
    reports = read_reports(run_dir) if reports is None else reports
    finished = sorted(r["world_rank"] for r in reports)
    lost = {w for r in reports for w in r["lost"]} | (set(range(world_size)) - set(finished))
    return finished, sorted(lost)


def failed_ranks(reports) -> list[int]:
    """World ranks whose exit report says the program ended by an uncaught exception."""
    return sorted(r["world_rank"] for r in reports if r.get("uncaught_exception"))
