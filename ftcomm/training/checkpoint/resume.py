"""Resuming from disk: which checkpoint (the newest complete one every rank can read), checked
against its checksums, and what happens when it cannot be used.

Every rank of the starting job (or of the survivors, after a ``StateLostError``):

1. lists the complete checkpoints and checks that every rank sees the same ones (a directory that
   is not on a shared file system would otherwise make ranks load different steps);
2. for the newest: checks its share of the data files against their XXH3-64 digests (file i by
   rank i mod N, each file read by one rank), and reads what it needs of it (``read_local``);
3. one agreement: every rank could, so every rank applies it (``apply``, collective); some rank
   could not (a damaged or missing file, a flipped bit): the checkpoint is skipped on every rank,
   said on stderr and in the log (``checkpoint_unusable``), and the next older one is tried. A
   checkpoint of another model or optimizer is the script's error, raised on every rank.
"""
from __future__ import annotations

import sys

from ...errors import InvalidInputError, StateLostError
from .dcp_parts import data_files, verify
from .directory import complete_steps, step_dir

_OK, _SAME_KIND = 1, 2  # bits of the agreement on a checkpoint


def candidates(comm, root: str | None, timeout: float | None = None) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints under ``root``, newest first, as every rank of
    ``comm`` sees them. Collective (one min/max round).

    Raises:
        InvalidInputError: on every rank, when ranks see different checkpoints (a directory that
            is not on a file system every node shares).
    """
    steps = complete_steps(root)
    mins, maxs = comm.minmax([steps[-1] if steps else -1, len(steps)], timeout=timeout)
    if mins != maxs:
        raise InvalidInputError(f"checkpoint directory {root!r}: the ranks see different checkpoints (newest "
                                f"step {mins[0]} on one rank, {maxs[0]} on another; -1: none); it must be on a "
                                "file system every node shares")
    return [(step, step_dir(root, step)) for step in reversed(steps)]


def agreed_latest(comm, root: str | None, timeout: float | None = None) -> tuple[int, str] | None:
    """The newest of ``candidates``, or None. Collective."""
    found = candidates(comm, root, timeout)
    return found[0] if found else None


def verify_share(comm, path: str) -> None:
    """Checks this rank's share of the checkpoint's data files (every ``comm.size``-th, in name
    order, from this rank's) against their recorded digests; nothing to check in a checkpoint
    written by another tool.

    Raises:
        CheckpointIOError: a file is missing, unreadable or changed.
    """
    files = data_files(path)
    if files:
        verify(path, sorted(files)[comm.rank::comm.size])


def _say(comm, text: str) -> None:
    print(f"ftcomm: world rank {comm.world_rank}: {text}", file=sys.stderr, flush=True)


def load_newest(comm, root: str, read_local, apply, log=None, timeout: float | None = None):
    """Loads the newest complete checkpoint under ``root`` that every rank can read (see the
    module docstring). Collective over ``comm``.

    Args:
        read_local: ``f(path, step)``: this rank's reading, no communication; returns what
            ``apply`` needs. Raises OSError, ValueError, KeyError, RuntimeError when it cannot,
            InvalidInputError when the checkpoint is of another model or optimizer.
        apply: ``f(path, step, local)``: makes it current, collectively; returns the result.
        log: ``log(**event)`` for ``checkpoint_unusable`` (default none).

    Returns:
        (step, path, apply's result), or None when there is no complete checkpoint.

    Raises:
        InvalidInputError: the checkpoint is of another model or optimizer (every rank).
        StateLostError: there are complete checkpoints, but none that every rank could read.
        ProcFailedError etc.: a rank failed meanwhile.
    """
    found = candidates(comm, root, timeout)
    for step, path in found:
        local, error = None, None
        try:
            verify_share(comm, path)
            local = read_local(path, step)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # InvalidInputError is a ValueError
            error = exc
        mismatch = isinstance(error, InvalidInputError)
        agreed = comm.agree((_OK if error is None else 0) | (0 if mismatch else _SAME_KIND), timeout=timeout)
        if not agreed & _SAME_KIND:
            raise error if mismatch else InvalidInputError(f"checkpoint {path} is of another model or optimizer "
                                                           "(found on another rank)")
        if agreed & _OK:
            return step, path, apply(path, step, local)
        if error is not None:
            _say(comm, f"cannot use checkpoint {path}: {error}")
        if comm.rank == 0:
            _say(comm, f"checkpoint {path} is unusable on some rank; trying the one before it")
        if log is not None:
            log(event="checkpoint_unusable", step=step, path=path, error=str(error) if error else "on another rank")
    if found:
        raise StateLostError(f"none of the complete checkpoints in {root!r} (steps {[s for s, _ in found]}) "
                             "could be read on every rank")
    return None
