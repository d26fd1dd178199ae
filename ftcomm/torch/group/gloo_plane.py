"""The gloo data plane: a resilient step's gradient buckets and ZeRO's parameter allgather
through an inner torch gloo group.

The inner group spans the ranks of the ftcomm communicator it was made for, in the same order.
Its rendezvous store is a ``TCPStore`` that the communicator's rank 0 opens on a free port; the
address reaches the other ranks by a broadcast over the communicator, so a group can be made
again after any recovery, whoever died (rank 0 included), with no fixed master.

Failures. gloo fails a collective when a peer's connection closes: a dead rank's at once, a
stopped rank's once ftcomm fences it (after FTCOMM_FENCE_TIMEOUT of silence), and any other after the
plane's deadline. Closing the group on error closes this rank's connections too, so that peers
still waiting on it in the same collective fail as well rather than wait for the deadline:
``ProcessGroupGloo.abort()`` does not interrupt a collective in progress (torch 2.13 and 2.15,
checked here: a collective waiting on a stopped peer ran to gloo's own timeout after it). The
error is raised as ``ProcFailedError``; the step's agreement over the communicator then voids the
step on every rank and the group recovers, after which the next bucket makes a new inner group.
"""
from __future__ import annotations

import collections
import datetime
import json
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from ...core import fault, liveness
from ...errors import FtError, ProcFailedError

_ADDRESS_BYTES = 512
_POLL = 0.05  # seconds between two looks at a waiting collective (it wakes at once when done)
_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


class GlooPlane:
    """An inner ``ProcessGroupGloo`` over the ranks of the communicator it is given, made on first
    use and again for each new communicator (after a recovery).

    Attributes:
        groups_made: inner groups made so far (1 + the recoveries that needed one).
        completed: collectives that completed here, by name ("allreduce", "allgather").
    """

    name = "gloo"

    def __init__(self):
        self._comm = None
        self._group = None
        self._store = None  # rank 0's TCPStore serves the rendezvous as long as the group lives
        self.groups_made = 0
        self.completed: collections.Counter = collections.Counter()

    def allreduce(self, comm, tensors: list[torch.Tensor], op: str, timeout) -> int:
        """Reduces the CPU ``tensors`` in place over ``comm``'s ranks (several: as one bucket, each
        reduced on its own). Returns the step id it is recorded under (``reserve_uncommitted_step``).

        Raises:
            ProcFailedError: the inner group could not be made or its collective failed (a peer
                died, was fenced, or the deadline passed); the inner group is closed.
            FtError: the communicator failed while the group was being made.
        """
        step = comm.reserve_uncommitted_step()
        opts = dist.AllreduceCoalescedOptions() if len(tensors) > 1 else dist.AllreduceOptions()
        opts.reduceOp = _OPS[op]
        opts.timeout = _deadline(timeout)

        def start(group):
            return group.allreduce_coalesced(tensors, opts) if len(tensors) > 1 else group.allreduce(tensors, opts)

        self._collective(comm, timeout, step, "allreduce", start, point="data_plane")
        if op == "avg":
            for t in tensors:
                t.div_(comm.size)
        return step

    def allgather(self, comm, src: np.ndarray, dst: np.ndarray, timeout) -> None:
        """Gathers every rank's contiguous 1-D ``src`` (the same length and dtype on every rank)
        into the contiguous ``dst`` of ``comm.size * src.size`` elements, in rank order,
        uncommitted: the caller's agreement commits it (ZeRO's parameter allgather).

        Raises:
            ProcFailedError, FtError: as ``allreduce``; ``dst`` is then undefined.
        """
        opts = _c10d.AllgatherOptions()
        opts.timeout = _deadline(timeout)
        out, inp = torch.from_numpy(dst.reshape(-1)), torch.from_numpy(src.reshape(-1))
        self._collective(comm, timeout, comm.last_committed_step + 1, "allgather",
                         lambda group: group._allgather_base(out, inp, opts))

    def abort(self) -> None:
        """Ends this rank's part in the inner group after a local error: its connections close,
        so peers waiting on this rank in a collective fail now instead of at the deadline."""
        self.close()

    def _collective(self, comm, timeout, step: int, name: str, start, point: str | None = None) -> None:
        """Runs ``start(group)``'s collective on the inner group for ``comm`` and waits for it; on
        failure closes the group and raises ``ProcFailedError`` at ``step``."""
        group = self._group_for(comm, timeout)
        if point:
            fault.point(point, comm.world_rank, step)
        failure = _run(group, start, comm)
        if failure is not None:
            # Nothing may keep the group or its context alive (not even a traceback's frame): its
            # connections close now, and peers still waiting on this rank in it fail too.
            group = None  # noqa: F841
            self.close()
            raise ProcFailedError(f"gloo data plane: {name} failed on world rank {comm.world_rank}: {failure}",
                                  step=step)
        self.completed[name] += 1

    def close(self) -> None:
        """Drops the inner group (its connections close) and the store."""
        self._comm = self._group = self._store = None

    def _group_for(self, comm, timeout):
        if self._comm is comm and self._group is not None:
            return self._group
        self.close()
        try:
            self._store = _rendezvous_store(comm, timeout)
            self._group = dist.ProcessGroupGloo(self._store, comm.rank, comm.size, _deadline(timeout))
        except FtError:
            self.close()
            raise
        except RuntimeError as error:  # a peer died between the broadcast and the rendezvous
            self.close()
            raise ProcFailedError(f"gloo data plane: no inner group over {comm.size} ranks: {error}",
                                  step=comm.last_committed_step + 1) from error
        self._comm = comm
        self.groups_made += 1
        return self._group


def _run(group, start, comm) -> str | None:
    """Runs ``start(group)``'s collective and waits for it; None when it succeeded, else gloo's error text (a
    string: an exception would keep this frame, and with it the collective, alive).

    Once it has waited the fence timeout, it SIGKILLs any peer on this host that has been silent
    that long (a stopped rank: its connections then close and the collective fails here), as
    ftcomm's own collectives do under either late-rank policy. The deadline is gloo's own (the
    collective's timeout option).
    """
    after = liveness.fence_timeout()
    peers = [w for w in comm.world_ranks if w != comm.world_rank]
    try:
        work = start(group)
        start = time.monotonic()
        while not _done(work, _POLL):
            if time.monotonic() - start >= after:
                liveness.fence_silent(peers, after)
        work.wait()  # its error, if it failed
    except RuntimeError as error:
        return str(error)
    return None


def _done(work, seconds: float) -> bool:
    """Whether ``work`` ended (well or not) within ``seconds``."""
    try:
        return bool(work.wait(datetime.timedelta(seconds=seconds)))
    except RuntimeError:
        return work.is_completed()  # failed, or only this wait timed out


def _deadline(timeout) -> datetime.timedelta:
    return datetime.timedelta(seconds=float(timeout))


def _rendezvous_store(comm, timeout) -> dist.TCPStore:
    """A new TCPStore served by ``comm``'s rank 0 on a free port, its address broadcast over
    ``comm`` (collective)."""
    address = np.zeros(_ADDRESS_BYTES, np.uint8)
    store = None
    if comm.rank == 0:
        host = socket.gethostname()
        store = dist.TCPStore(host, 0, comm.size, True, timeout=_deadline(timeout), wait_for_workers=False)
        raw = json.dumps([host, store.port]).encode()
        address[:len(raw)] = np.frombuffer(raw, np.uint8)
    comm.broadcast(address, root=0, timeout=timeout)
    host, port = json.loads(address.tobytes().rstrip(b"\0"))
    if store is None:
        store = dist.TCPStore(host, port, comm.size, False, timeout=_deadline(timeout))
    return store
