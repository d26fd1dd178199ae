"""Fault injection: make a rank fail at a named point of the protocol.

Specs come from the FTCOMM_FAULT environment variable (read at import) or from ``inject()``. A
spec is a comma-separated list of key=value pairs; several specs are separated by ';'::

    FTCOMM_FAULT="rank=2,point=allgather,step=3,ring_step=1,chunk=0,kind=kill"

Keys: ``rank`` (MPI_COMM_WORLD rank; default every rank), ``point`` (required), ``step``,
``ring_step``, ``chunk`` (default any), ``kind`` = kill (SIGKILL, default), exit (exit status 1),
hang (sleeps forever), stop (SIGSTOP), bitflip (once: one bit of the ring chunk that just arrived
at ``reduce_scatter`` and ``allgather``, silent corruption in transit; the torch backend's
``params`` and ``gradient`` points flip a rank's parameters or local gradient, docs/FAULTS.md).

Points in the allreduce: ``before`` (before any communication), ``reduce_scatter`` and
``allgather`` (after receiving chunk ``chunk`` of ring step ``ring_step``), ``commit`` (just before
the commit agreement). The training layer adds ``replicate``, ``shrink``, ``rebuild`` and
``train_step``, the torch backend ``join`` (see docs/FAULTS.md). ``ftcomm.fault`` is this module.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

from .. import _C, settings
from .buffers import raw as raw_buffer
from .codes import FAULT_KINDS as KINDS
_INT_KEYS = ("rank", "step", "ring_step", "chunk")


def parse(text: str) -> list[dict]:
    """Parses FTCOMM_FAULT syntax into a list of dicts. Raises ValueError on a malformed spec."""
    specs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        spec = {"rank": -1, "step": -1, "ring_step": -1, "chunk": -1, "kind": "kill"}
        for item in filter(None, (i.strip() for i in part.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in (*_INT_KEYS, "point", "kind"):
                raise ValueError(f"FTCOMM_FAULT: cannot read {item!r} in {part!r}")
            spec[key] = int(value) if key in _INT_KEYS else value.strip()
        if "point" not in spec:
            raise ValueError(f"FTCOMM_FAULT: {part!r} names no point")
        if spec["kind"] not in KINDS:
            raise ValueError(f"FTCOMM_FAULT: kind must be one of {sorted(KINDS)}, not {spec['kind']!r}")
        specs.append(spec)
    return specs


_said: set = set()  # what can_recover has already warned about in this process


def can_recover(what: str) -> bool:
    """Whether this job survives a rank's failure: ULFM on and more than one rank. If not, says so
    once per ``what`` on stderr (world rank 0), naming ``what`` (the failure, policy or spares the
    script asked for) and why (``ftcomm.ulfm_status()``), so that a run started without
    ``ftcomm-run`` does not silently ignore it."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if _C.ft_enabled() and world.Get_size() > 1:
        return True
    why = _C.ft_status() if not _C.ft_enabled() else "it has one rank (world size 1): start it with ftcomm-run -n N"
    if what not in _said and world.Get_rank() == 0:
        _said.add(what)
        print(f"ftcomm: {what} needs a job that can recover from a failure, and this one cannot: {why}",
              file=sys.stderr, flush=True)
    return False


_unsaid: list = []  # faults armed from FTCOMM_FAULT at import, checked once a communicator exists


def inject(point: str, rank: int = -1, step: int = -1, ring_step: int = -1, chunk: int = -1,
           kind: str = "kill", check_now: bool = True) -> None:
    """Arms a fault: world rank ``rank`` fails with ``kind`` when it reaches ``point``. In a job
    that cannot recover it is armed all the same, and ``can_recover`` says so once (now, or with
    ``check_now=False`` when the first communicator is made: ``say_unsaid``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}")
    if kind != "bitflip":
        what = f"fault injection ({kind} at {point})"
        if check_now:
            can_recover(what)
        else:
            _unsaid.append(what)
    _C.fault_add(point, rank, step, ring_step, chunk, KINDS[kind])


def say_unsaid() -> None:
    """``can_recover`` for the faults armed at import (``Communicator()`` calls it): not at
    import itself, since ``ftcomm-run``'s own process imports ftcomm too, and it is no job."""
    while _unsaid:
        can_recover(_unsaid.pop(0))


def crash_node() -> None:
    """Testing and demos: ends this rank as a crash of its node would, by SIGKILLing this rank's
    Open MPI daemon (its parent process: PRRTE's ``prted``, on a real node or on a made-up one of
    ``ftcomm-run --fake-nodes``) and then the rank itself. Called on every rank of the node at the
    same point; with Open MPI 5.0.x the runtime then ends the whole job (docs/NODE_LOSS.md), and
    ``ftcomm-run --restarts`` relaunches it without that node. The daemon's session directory
    goes too (``$TMPDIR/prted.<pid>``), as a crashed node's would with it: left on a machine that
    plays several nodes, a later daemon given the same pid failed to start its PMIx listener."""
    daemon = os.getppid()
    shutil.rmtree(os.path.join(tempfile.gettempdir(), f"prted.{daemon}"), ignore_errors=True)
    os.kill(daemon, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def clear() -> None:
    """Disarms every fault."""
    _C.fault_clear()


def point(name: str, world_rank: int, step: int) -> None:
    """A fault point in Python code (the training layer's phases)."""
    _C.fault_point(name, world_rank, step)


def flip(name: str, world_rank: int, step: int, buf) -> bool:
    """A bitflip point in Python code: if a ``kind=bitflip`` spec names it, flips one bit of
    ``buf`` (a contiguous numpy array or CPU tensor, written in place) once. Returns whether it
    flipped."""
    address, nbytes = raw_buffer(buf, writable=True)
    return bool(_C.fault_flip(name, world_rank, step, address, nbytes))


def load_from_env() -> None:
    """Arms the faults that FTCOMM_FAULT names (``import ftcomm`` calls it)."""
    for spec in parse(settings.fault_specs()):
        inject(spec["point"], spec["rank"], spec["step"], spec["ring_step"], spec["chunk"], spec["kind"],
               check_now=False)
