"""Settings read from the environment, with their defaults and units."""
from __future__ import annotations

import os


def _float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from exc


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"{name}={value!r} is not an integer") from exc


def default_timeout() -> float:
    """FTCOMM_TIMEOUT: deadline of every blocking call, in seconds (default 60)."""
    return _float("FTCOMM_TIMEOUT", 60.0)


def chunk_bytes() -> int:
    """FTCOMM_CHUNK_BYTES: ring allreduce chunk size in bytes (default 1 MiB)."""
    return _int("FTCOMM_CHUNK_BYTES", 1 << 20)


def finalize_timeout() -> float:
    """FTCOMM_FINALIZE_TIMEOUT: seconds MPI_Finalize may take at exit before the rank just exits."""
    return _float("FTCOMM_FINALIZE_TIMEOUT", 30.0)


def join_timeout() -> float:
    """FTCOMM_JOIN_TIMEOUT: seconds the survivors of a torch job wait for a promoted spare to
    start (imports, data set, model) and reach the hand-over (default 600)."""
    return _float("FTCOMM_JOIN_TIMEOUT", 600.0)


def spares() -> int:
    """FTCOMM_SPARES: idle spare ranks at the end of MPI_COMM_WORLD (set by ``ftcomm-run
    --spares S``; default 0)."""
    return _int("FTCOMM_SPARES", 0)


def recovery_policy() -> str:
    """FTCOMM_RECOVERY_POLICY: what ``Communicator.recover()`` does by default: "shrink"
    (default), "spares" or "respawn"."""
    return os.environ.get("FTCOMM_RECOVERY_POLICY") or "shrink"
