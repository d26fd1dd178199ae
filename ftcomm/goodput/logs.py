"""Reading a run's JSON-lines event logs.

A run writes one file per world rank (the elastic driver's ``EventLog``, ftcomm/training/events.py
lists the event kinds): ``PREFIXrankN.jsonl``, where PREFIX tells runs apart in one directory
(the digits demo writes ``RUNID.rankN.jsonl``, benchmarks/mttr.py ``rankN.jsonl``). Times in the
events are Unix seconds (``time.time()`` of the rank that wrote them: one machine, or clocks kept
in step by NTP).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(r"^(?P<prefix>.*?)rank(?P<rank>\d+)\.jsonl$")


@dataclass
class RunLog:
    """Every event of one run.

    Attributes:
        directory: where the files are.
        run_id: the file-name prefix shared by the run's files ("" for ``rankN.jsonl``).
        events: every rank's events, sorted by ``time``; each a dict with at least ``event``,
            ``time`` (Unix seconds) and ``rank`` (world rank).
        files: the files read, by world rank.
    """

    directory: Path
    run_id: str
    events: list = field(default_factory=list)
    files: dict = field(default_factory=dict)

    def of(self, kind: str, rank: int | None = None) -> list[dict]:
        """The events of one kind (``"commit"``, ``"recovered"``, ...), of one rank if given."""
        return [e for e in self.events if e["event"] == kind and (rank is None or e["rank"] == rank)]

    @property
    def ranks(self) -> list[int]:
        """World ranks that wrote at least one event, sorted."""
        return sorted({e["rank"] for e in self.events})


def find_runs(directory) -> dict[str, list[Path]]:
    """The runs in ``directory``: file-name prefix -> its ``*rankN.jsonl`` files.

    Raises:
        FileNotFoundError: ``directory`` does not exist.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no such log directory: {directory}")
    runs: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        match = _NAME.match(path.name)
        if match:
            runs.setdefault(match["prefix"], []).append(path)
    return runs


def read_jsonl(path) -> list[dict]:
    """The JSON objects of a JSON-lines file, blank lines skipped. A last line cut short (the
    process was killed while writing it) is skipped too.

    Raises:
        ValueError: a line before the last is not a JSON object (naming the file and line).
    """
    lines = Path(path).read_text().splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # torn last line of a killed writer
            raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
        if not isinstance(value, dict) or "event" not in value or "time" not in value:
            raise ValueError(f"{path}:{number}: not an ftcomm event (no 'event' or 'time')")
        out.append(value)
    return out


def load_run(directory, run_id: str | None = None) -> RunLog:
    """One run's events from ``directory``: the run ``run_id`` (a file-name prefix; a prefix
    without its trailing dot is accepted), else the run whose files were written last.

    Raises:
        FileNotFoundError: no directory, or no ``*rankN.jsonl`` file in it, or no such run.
        ValueError: a malformed line (``read_jsonl``).
    """
    runs = find_runs(directory)
    if not runs:
        raise FileNotFoundError(f"no *rankN.jsonl event logs in {directory}")
    if run_id is None:
        run_id = max(runs, key=lambda k: max(p.stat().st_mtime for p in runs[k]))
    elif run_id not in runs and f"{run_id}." in runs:
        run_id = f"{run_id}."
    if run_id not in runs:
        raise FileNotFoundError(f"no run {run_id!r} in {directory}; runs: {sorted(runs)}")
    run = RunLog(Path(directory), run_id)
    for path in runs[run_id]:
        rank = int(_NAME.match(path.name)["rank"])
        run.files[rank] = path
        for event in read_jsonl(path):
            event.setdefault("rank", rank)
            run.events.append(event)
    run.events.sort(key=lambda e: e["time"])
    return run
