"""The exit reports ranks leave in the run directory (``ftcomm.core.runtime``), read by
``ftcomm-run`` to tell a recovered job from a failed one; and, on MPICH, which rank's end ended
the job, from mpiexec's own report.
"""
from __future__ import annotations

import json
import re
from pathlib import Path


def read_reports(run_dir: str) -> list[dict]:
    """The exit reports that ranks left in the run directory (one cut short, its rank killed while
    writing it, is left out)."""
    reports = []
    for path in Path(run_dir).glob("rank*.json"):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return reports


def summarize(run_dir: str, world_size: int, reports=None) -> tuple[list[int], list[int]]:
    """(finished world ranks, lost world ranks) from the ranks' exit reports."""
    reports = read_reports(run_dir) if reports is None else reports
    finished = sorted(r["world_rank"] for r in reports)
    lost = {w for r in reports for w in r["lost"]} | (set(range(world_size)) - set(finished))
    return finished, sorted(lost)


def failed_ranks(reports) -> list[int]:
    """World ranks whose exit report says the program ended by an uncaught exception."""
    return sorted(r["world_rank"] for r in reports if r.get("uncaught_exception"))


# The report MPICH's mpiexec (hydra) prints on stdout when a process ends badly, and the line
# after it that says how:
#   =   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
#   =   PID 5784 RUNNING AT node1
#   =   EXIT CODE: 9
#   YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
# The process it names is not always the one that ended first: hydra kills the others at once
# (SIGKILL) and may report any of them (seen here with 4 ranks).
_HYDRA_PID = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\s*\n=\s*PID (\d+) RUNNING AT")
_HYDRA_EXIT_STRING = re.compile(r"EXIT STRING: ([^\n]+)")


def hydra_report(output: str) -> tuple[int, str] | None:
    """(pid, how it ended) from MPICH's mpiexec report of a bad termination at the end of a job's
    stdout, e.g. (5784, "Killed (signal 9)"); None when there is none."""
    found = _HYDRA_PID.search(output)
    if found is None:
        return None
    how = _HYDRA_EXIT_STRING.search(output, found.end())
    return int(found.group(1)), how.group(1).strip() if how else "unknown"


def pid_files(run_dir: str) -> dict[int, int]:
    """{world rank: pid} of the ranks that published their pid in the run directory
    (ftcomm/core/runtime.py)."""
    pids = {}
    for path in Path(run_dir).glob("pid-rank*"):
        try:
            pids[int(path.name[len("pid-rank"):])] = int(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or not ours
    return pids


def mpich_failure(first_ended: tuple[int, int] | None, output: str) -> str:
    """What ended an MPICH job, in words: the world rank whose process ended first on this host
    (``first_ended``: (world rank, pid), from the launcher's watch; None when it could not tell),
    with how it ended when mpiexec's report names the same process."""
    report = hydra_report(output)
    if first_ended is None:
        how = f" (mpiexec's report: pid {report[0]}: {report[1]})" if report else ""
        return f"a process of the job ended{how}"
    rank, pid = first_ended
    how = f": {report[1]}" if report and report[0] == pid else ""
    return f"world rank {rank} (pid {pid}) ended first{how}"


def committed_ranks(run_dir: str) -> list[int]:
    """World ranks that committed a step in this launch: each leaves ``committed-rank<world
    rank>`` in the run directory at its first committed step
    (``ftcomm.core.runtime.note_committed``)."""
    ranks = []
    for path in Path(run_dir).glob("committed-rank*"):
        suffix = path.name[len("committed-rank"):]
        if suffix.isdigit():
            ranks.append(int(suffix))
    return sorted(ranks)
