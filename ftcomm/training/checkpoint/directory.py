"""The checkpoint directory: where a checkpoint is written, when it counts as complete, what is
kept.

    DIR/step00000040/                 a complete checkpoint (DCP format, with its .metadata)
    DIR/step00000050.tmp-0-1a2b3c4d/  one being written: every rank's files and part file

A checkpoint is written under a temporary name and renamed to ``stepNNNNNNNN`` by one rank, after
an agreement said every rank's part is on disk and after that rank joined the parts into the
``.metadata``. A rename is atomic, so a reader sees a checkpoint whole or not at all, and a
failure at any moment of a write leaves the complete checkpoints as they were. The newest
``keep`` complete checkpoints are kept; an older one is removed only after a newer one is
complete. Only the publishing rank removes anything, and only names of this form.
"""
from __future__ import annotations

import os
import re
import shutil

from . import dcp_parts

_COMPLETE = re.compile(r"step(\d{8,})$")
_TEMPORARY = re.compile(r"step(\d{8,})(\.tmp-[\w-]+|\.replaced)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step{step:08d}")


def temporary_dir(root: str, step: int, token: str) -> str:
    """Where the checkpoint of ``step`` is written before it is complete; ``token`` tells apart the
    writes of different launches and groups (the same on every rank of one group)."""
    return os.path.join(root, f"step{step:08d}.tmp-{token}")


def complete_steps(root: str | None) -> list[int]:
    """Steps of the complete checkpoints under ``root``, oldest first ([] when there is none or no
    such directory)."""
    if not root or not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        found = _COMPLETE.match(name)
        if found and dcp_parts.is_complete(os.path.join(root, name)):
            steps.append(int(found.group(1)))
    return sorted(steps)


def latest(root: str | None) -> tuple[int, str] | None:
    """(step, path) of the newest complete checkpoint under ``root``, or None."""
    steps = complete_steps(root)
    return (steps[-1], step_dir(root, steps[-1])) if steps else None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(root: str, temporary: str, step: int) -> str:
    """Renames the joined checkpoint ``temporary`` to its final name (replacing a complete one of
    the same step, e.g. written again after a relaunch) and makes the rename durable. Returns
    the final path."""
    final = step_dir(root, step)
    _fsync_dir(temporary)
    if os.path.exists(final):
        aside = final + ".replaced"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(temporary, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(temporary, final)
    _fsync_dir(root)
    return final


def prune(root: str, keep: int, older_than: int) -> list[str]:
    """Removes complete checkpoints older than the newest ``keep``, and the temporary ones of
    writes that never completed (and a ``.replaced`` one a publish left), for steps up to
    ``older_than`` (a later step's may be being written now). Returns the names removed."""
    removed = []
    steps = complete_steps(root)
    for step in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
        removed.append(os.path.basename(step_dir(root, step)))
    for name in os.listdir(root):
        path = os.path.join(root, name)
        found = _TEMPORARY.match(name)
        if found and int(found.group(1)) <= older_than:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed
