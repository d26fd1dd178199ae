"""Host bookkeeping for ``ftcomm-run --restarts``: which hosts a job may run on, which of them a
relaunch may still use, and how many ranks they hold.

The hosts come from ``--hostfile`` (Open MPI's format: ``name slots=N``), or, inside a Slurm
allocation without a hostfile, from ``scontrol show hostnames "$SLURM_JOB_NODELIST"``. A relaunch
runs on those hosts, in their order, minus every host lost so far (``sessions.lost_hosts``): a
spare host of the hostfile, unused by the first launch, is thereby taken in.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Host:
    """One host: its ``name`` as the hostfile gives it and its ``slots`` (ranks it takes; None
    when the hostfile does not say, and Open MPI then counts its cores)."""

    name: str
    slots: int | None = None


def read_hostfile(path: str) -> list[Host]:
    """The hosts of an Open MPI hostfile, in order: ``name [slots=N] [max_slots=M]`` lines,
    ``#`` comments and blank lines skipped; a host named twice adds up its slots.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line's slots are not a whole number (the message names the line).
    """
    hosts: dict[str, int | None] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots":
                if not value.isdigit():
                    raise ValueError(f"{path}:{lineno}: slots must be a whole number, got {word!r}")
                slots = int(value)
        name = words[0]
        if name not in hosts:
            hosts[name] = slots
        elif hosts[name] is not None and slots is not None:  # Open MPI adds the lines up
            hosts[name] += slots
        else:
            hosts[name] = None
    return [Host(name, slots) for name, slots in hosts.items()]


def expand_counts(text: str) -> list[int]:
    """Slurm's compressed per-node counts, e.g. SLURM_JOB_CPUS_PER_NODE ``"72(x2),36"``, as one
    count per node: ``[72, 72, 36]``.

    Raises:
        ValueError: the text is not of that form.
    """
    counts = []
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            raise ValueError(f"not a Slurm count list: {text!r}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def slurm_hosts(environ=None) -> list[Host] | None:
    """The nodes of the Slurm allocation this process runs in, in Slurm's order, with their slots
    (SLURM_NTASKS_PER_NODE, else SLURM_JOB_CPUS_PER_NODE); None outside Slurm.

    Raises:
        OSError: ``scontrol`` cannot be run, or it fails (the message has its error).
    """
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise OSError("scontrol show hostnames took over 60 s") from None
    if done.returncode != 0:
        raise OSError(f"scontrol show hostnames {nodelist} failed: {done.stderr.strip()}")
    names = done.stdout.split()
    per_node = environ.get("SLURM_NTASKS_PER_NODE")
    if per_node:
        slots = [int(per_node)] * len(names)
    elif environ.get("SLURM_JOB_CPUS_PER_NODE"):
        slots = expand_counts(environ["SLURM_JOB_CPUS_PER_NODE"])
    else:
        slots = []
    slots += [None] * (len(names) - len(slots))
    return [Host(name, count) for name, count in zip(names, slots)]


def same_host(a: str, b: str) -> bool:
    """True when two names name one host: equal, or equal up to the domain (``n1`` and
    ``n1.cluster``), since the launcher may hand a daemon's host on in either form."""
    return a == b or a.split(".", 1)[0] == b.split(".", 1)[0]


def usable_hosts(hosts: list[Host], lost: set[str]) -> list[Host]:
    """``hosts`` without the ``lost`` ones, in order."""
    return [h for h in hosts if not any(same_host(h.name, name) for name in lost)]


def capacity(hosts: list[Host], ranks_per_node: int | None) -> int | None:
    """How many ranks ``hosts`` hold: ``ranks_per_node`` on each (``--ranks-per-node K``), else
    the sum of their slots; None when a host's slots are unknown (no limit known here)."""
    if ranks_per_node:
        return ranks_per_node * len(hosts)
    if any(h.slots is None for h in hosts):
        return None
    return sum(h.slots for h in hosts)


def fit_world(ranks: int, spares: int, room: int | None) -> tuple[int, int]:
    """(ranks, spares) of a relaunch on hosts that hold ``room`` ranks (None: no limit): as asked
    when they fit; else spares are given up first, then ranks."""
    if room is None or ranks + spares <= room:
        return ranks, spares
    if ranks <= room:
        return ranks, room - ranks
    return room, 0


def write_hostfile(hosts: list[Host], path: str) -> None:
    """Writes ``hosts`` as an Open MPI hostfile, one ``name slots=N`` line each, in order."""
    lines = [h.name if h.slots is None else f"{h.name} slots={h.slots}" for h in hosts]
    Path(path).write_text("".join(line + "\n" for line in lines))


def names(hosts: list[Host]) -> str:
    """``"n1, n3"``: the hosts' names, for messages."""
    return ", ".join(h.name for h in hosts)
