"""Which checkpoint a starting job resumes from: the newest complete one, the same on every rank."""
from __future__ import annotations

from ...errors import InvalidInputError
from .directory import latest, step_dir


def agreed_latest(comm, root: str | None, timeout: float | None = None) -> tuple[int, str] | None:
    """(step, path) of the newest complete checkpoint under ``root`` as every rank of ``comm``
    sees it, or None when there is none. Collective (one min/max round).

    Raises:
        InvalidInputError: on every rank, when ranks see different newest checkpoints (a
            directory that is not on a file system every node shares), naming both steps.
    """
    found = latest(root)
    mins, maxs = comm.minmax([found[0] if found else -1], timeout=timeout)
    if mins[0] != maxs[0]:
        raise InvalidInputError(f"checkpoint directory {root!r}: the ranks see different newest checkpoints "
                                f"(steps {mins[0]} and {maxs[0]}; -1: none); it must be on a file system every "
                                "node shares")
    return None if mins[0] < 0 else (mins[0], step_dir(root, mins[0]))
