"""Where node-local shared memory segments live, by job and node (``training/node_memory.py``
writes and reads them; ``ftcomm-run`` removes them). Plain paths, so that the launcher needs no
MPI or torch to clean up:

    <FTCOMM_SHM_DIR>/ftcomm-<uid>-<job>/<node>/

``job`` names the ftcomm-run process that started the job (``settings.job_id``): the same for
every relaunch of it, different for any other job.
"""
from __future__ import annotations

import os
import re
import shutil

from . import settings


def job_dir(key: str | None = None, root: str | None = None) -> str | None:
    """``<root>/ftcomm-<uid>-<job>``: every node's segments of one job (``key``: default this
    job's, ``settings.job_id``; None: no job)."""
    key = key or settings.job_id()
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
