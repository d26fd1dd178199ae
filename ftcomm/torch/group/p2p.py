"""Point-to-point for the torch backend: send, recv and recv from any source (torch's isend, irecv
and batch_isend_irecv are made of them).

Each operation is posted at the call, on the caller's thread, as one MPI nonblocking send or
receive on the group's communicator, under the caller's tag (torch's tags; ftcomm's own messages
use tags from 7000 up, so the two never match each other). A waiter thread then tests it until it
completes, fails, or its deadline passes, and completes the Work. Not the communication thread
that runs the collectives in program order: a send and a receive between two ranks, issued in
either order on each, must not wait for each other.

Failures are local, as point-to-point is by nature; each raises on this rank within the deadline
and leaves the communicator as it is (the survivors' next collective finds a dead rank and
recovers the group):

- the peer died: ULFM completes the operation with MPI_ERR_PROC_FAILED: ``ProcFailedError``;
- the peer is stopped: fenced after FTCOMM_FENCE_TIMEOUT of silence (under either late-rank
  policy, as in ftcomm's collectives), then dead, as above;
- a live peer never matched it: ``CollectiveTimeoutError`` naming the peer at the deadline. A
  receive is cancelled. Open MPI cannot cancel a send (MPI allows that): it stays posted, its
  buffer kept alive here, and a receive the peer posts later still gets the message. An operation
  that completes between the deadline and the cancel counts as done (no error, no lost data);
- another survivor's collective found a failure first and revoked the communicator:
  ``RevokedError``;
- a receive from any source when some rank of the group has failed: ULFM reports
  MPI_ERR_PROC_FAILED_PENDING (the dead rank might have been the sender, and no message will
  ever come from it); the receive is cancelled, the failure acknowledged, and
  ``ProcFailedError`` raised: never a wait for a dead sender (ULFM, MPI 5.0 draft, chapter 17
  "Process Fault Tolerance", on wildcard receives).

A message of another size than the receiving tensor is an ``InvalidInputError`` on the receiver
(a shorter one has already been written into the tensor's first bytes). Any other MPI error is an
``MpiError``.
"""
from __future__ import annotations

import threading
import time

import torch
from mpi4py import MPI

from ...core import liveness
from ...core.mpi_calls import serialized
from ...errors import CollectiveTimeoutError, InvalidInputError, MpiError, ProcFailedError, RevokedError
from .host_bytes import byte_view
from .work import FtWork, make_future

FIRST_RESERVED_TAG = 7000  # ftcomm.core.codes.Tag: ftcomm's own messages
_FIRST_POLL_S, _LAST_POLL_S = 50e-6, 5e-3  # a waiter's tests back off from 50 us to 5 ms
# Sends that timed out and could not be cancelled, with their buffers: MPI still reads them until a
# receive matches. Dropped once complete (``_reap_uncancelled``, at each post).
_UNCANCELLED: list = []
_UNCANCELLED_LOCK = threading.Lock()


def check_tag(tag, name: str) -> int:
    """``tag`` as an int in [0, 7000).

    Raises:
        ValueError: any other tag, naming it.
    """
    if not isinstance(tag, int) or not 0 <= tag < FIRST_RESERVED_TAG:
        raise ValueError(f"ftcomm backend: {name} tag {tag!r} is not an int in [0, {FIRST_RESERVED_TAG}) "
                         "(ftcomm's own messages use the tags from there up)")
    return tag


def check_peer(peer: int, comm, name: str) -> int:
    """``peer`` as a rank of ``comm`` other than this one.

    Raises:
        ValueError: naming the peer and the group's ranks.
    """
    if not isinstance(peer, int) or not 0 <= peer < comm.size or peer == comm.rank:
        raise ValueError(f"ftcomm backend: {name} peer {peer!r} is not another rank of the group "
                         f"(0..{comm.size - 1}, this is {comm.rank})")
    return peer


class P2PWork(FtWork):
    """An ``FtWork`` that also says which rank a receive from any source matched
    (``_source_rank``, what ``dist.recv(src=None)`` returns)."""

    def __init__(self, future, op_name: str):
        super().__init__(future, op_name)
        self.source = -1

    def _source_rank(self) -> int:
        return self.source


def post(comm, tensor: torch.Tensor, peer: int | None, tag: int, is_send: bool, timeout: float,
         staging) -> P2PWork:
    """Posts one send (``is_send``) or receive of the host tensor ``staging.host(tensor)`` to or
    from ``peer`` (None: any source) and returns its Work. ``staging`` (``device.py``) is
    staged in at once and copied back when a receive succeeds."""
    name = "send" if is_send else ("recv_anysource" if peer is None else "recv")
    _reap_uncancelled()
    fut = make_future(staging.devices)
    work = P2PWork(fut, name)
    staging.stage_in()
    host = staging.host(tensor)
    buf = host if host.is_contiguous() else host.contiguous()
    mpi = comm.mpi_comm
    source = MPI.ANY_SOURCE if peer is None else peer
    with serialized():
        request = mpi.Isend([byte_view(buf), MPI.BYTE], peer, tag) if is_send else \
            mpi.Irecv([byte_view(buf), MPI.BYTE], source, tag)

    def finish(status: MPI.Status) -> None:
        if not is_send:
            if status.Get_count(MPI.BYTE) != buf.nbytes:
                sender = status.Get_source()
                raise InvalidInputError(
                    f"recv on world rank {comm.world_rank}: the message from group rank {sender} (world rank "
                    f"{comm.world_ranks[sender]}) holds {status.Get_count(MPI.BYTE)} bytes, the tensor "
                    f"{buf.nbytes} (a shorter message is already in the tensor's first bytes)")
            work.source = status.Get_source()
            if buf is not host:
                host.copy_(buf)
            staging.copy_back()

    waiter = threading.Thread(target=_wait, name=f"ftcomm-{name}", daemon=True,
                              args=(request, buf, comm, name, peer, timeout, finish, fut, tensor))
    waiter.start()
    return work


def _wait(request, buf, comm, name: str, peer, timeout: float, finish, fut, tensor) -> None:
    """The waiter thread: tests ``request`` until it is done, fails, or the deadline passes, and
    completes ``fut`` accordingly."""
    try:
        _until_done(request, buf, comm, name, peer, timeout, finish)
    except BaseException as error:  # noqa: BLE001 - reported through the future
        fut.set_exception(error)
    else:
        fut.set_result([tensor])


def _until_done(request, buf, comm, name: str, peer, timeout: float, finish) -> None:
    start = time.monotonic()
    fence_after = liveness.fence_timeout()
    peers = [w for w in comm.world_ranks if w != comm.world_rank] if peer is None else [comm.world_ranks[peer]]
    pause = _FIRST_POLL_S
    status = MPI.Status()
    while True:
        try:
            if _test(request, status):
                finish(status)
                return
        except MPI.Exception as error:
            pending = error.Get_error_class() == MPI.ERR_PROC_FAILED_PENDING
            if pending and _completed_before_cancel(request, finish, buf):
                return
            raise _failure(error, comm, name, peer) from None
        waited = time.monotonic() - start
        if waited >= timeout:
            if _completed_before_cancel(request, finish, buf):
                return
            raise CollectiveTimeoutError(f"{name} on world rank {comm.world_rank}: not matched by "
                                         f"{_whom(comm, peer)} within {timeout:g} s" + (
                                             "; Open MPI cannot cancel a send: it stays posted, and a matching "
                                             "receive posted later still gets the message" if name == "send" else ""))
        if waited >= fence_after:
            liveness.fence_silent(peers, fence_after)  # a stopped peer: dead after this
        time.sleep(pause)
        pause = min(pause * 2, _LAST_POLL_S)


def _failure(error, comm, name: str, peer):
    """The ftcomm error for an MPI error of a point-to-point operation."""
    code = error.Get_error_class()
    where = f"{name} on world rank {comm.world_rank} with {_whom(comm, peer)}"
    if code == MPI.ERR_PROC_FAILED_PENDING:  # any source, and some rank failed: never wait for it
        failed = _acknowledge_failures(comm)
        return ProcFailedError(f"{where}: world rank(s) {[comm.world_ranks[r] for r in failed]} failed; a "
                               "receive from any source might have been waiting for them", failed_ranks=failed)
    if code == MPI.ERR_PROC_FAILED:
        return ProcFailedError(f"{where}: the peer failed", failed_ranks=[] if peer is None else [peer])
    if code == MPI.ERR_REVOKED:
        return RevokedError(f"{where}: the communicator was revoked (recover first)")
    if code == MPI.ERR_TRUNCATE:
        return InvalidInputError(f"{where}: the message is larger than the tensor")
    return MpiError(f"{where}: MPI error {error.Get_error_string()}")


def _acknowledge_failures(comm) -> list[int]:
    """Acknowledges the failures this rank knows of (re-arming wildcard receives); their ranks in
    ``comm``."""
    mpi = comm.mpi_comm
    with serialized():
        mpi.Ack_failed()
        failed, everyone = mpi.Get_failed(), mpi.Get_group()
    try:
        ranks = failed.Translate_ranks(list(range(failed.Get_size())), everyone)
    finally:
        failed.Free()
        everyone.Free()
    return [r for r in ranks if r != MPI.UNDEFINED]


def _completed_before_cancel(request, finish, buf, give_up_s: float = 1.0) -> bool:
    """Cancels ``request`` and waits up to ``give_up_s`` seconds for it to complete. True when it
    completed without being cancelled (it matched first: ``finish`` has taken its result), False
    when the cancel took or, for a send Open MPI cannot cancel, it is still posted (then kept,
    with ``buf``, until it completes)."""
    status = MPI.Status()
    try:
        with serialized():
            request.Cancel()
        deadline = time.monotonic() + give_up_s
        while not _test(request, status):
            if time.monotonic() >= deadline:
                with _UNCANCELLED_LOCK:
                    _UNCANCELLED.append((request, buf))
                return False
            time.sleep(1e-3)
    except MPI.Exception:
        return False
    if status.Is_cancelled():
        return False
    finish(status)
    return True


def _reap_uncancelled() -> None:
    """Drops the kept sends that have completed since (a receive matched them)."""
    with _UNCANCELLED_LOCK:
        pending = []
        for request, buf in _UNCANCELLED:
            try:
                if not _test(request):
                    pending.append((request, buf))
            except MPI.Exception:
                pass  # its peer failed: MPI is done with the buffer
        _UNCANCELLED[:] = pending


def _test(request, status=None) -> bool:
    with serialized():
        return request.Test(status)


def _whom(comm, peer) -> str:
    return "any rank" if peer is None else f"rank {peer} (world rank {comm.world_ranks[peer]})"
