"""Where node-local shared memory segments live, by job and node (``training/node_memory.py``
writes and reads them; ``ftcomm-run`` removes them). Plain paths, so that the launcher needs no
MPI or torch to clean up:

    <FTCOMM_SHM_DIR>/ftcomm-<uid>-<job>/<node>/

``job`` names the ftcomm-run process that started the job (FTCOMM_LAUNCHER): the same for every
relaunch of it, different for any other job.
"""
from __future__ import annotations

import os
import re
import shutil

from . import settings


def job_key() -> str | None:
    """The job's name in segment paths (``settings.job_id``: ftcomm-run's host, pid and start
    time), or None outside ftcomm-run (no job to relaunch: no segments)."""
    return settings.job_id()


def job_key_of(host: str, pid: int, start: int) -> str:
    """The job key of the ftcomm-run process ``pid`` on ``host`` started at ``start`` (clock
    ticks after boot): what ``settings.job_id`` gives its ranks."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{host}-{pid}-{start}")


def job_dir(key: str | None = None, root: str | None = None) -> str | None:
    """``<root>/ftcomm-<uid>-<job>``: every node's segments of one job (None: no job)."""
    key = key or job_key()
    if key is None:
        return None
    return os.path.join(root or settings.shm_dir(), f"ftcomm-{os.getuid()}-{key}")


def node_dir(node: str, key: str | None = None, root: str | None = None) -> str | None:
    """One node's segments of one job."""
    base = job_dir(key, root)
    return None if base is None else os.path.join(base, re.sub(r"[^A-Za-z0-9_.-]", "_", node))


def remove_node(node: str, key: str | None = None, root: str | None = None) -> None:
    """Deletes a node's segments of this job (ftcomm-run, for a made-up node it dropped: a real
    node's would be gone with it)."""
    path = node_dir(node, key, root)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def remove_job(key: str | None = None, root: str | None = None) -> None:
    """Deletes this host's segments of the job (ftcomm-run, when the job is over or given up)."""
    path = job_dir(key, root)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
