"""A barrier that says which ranks did not reach it: gloo's ``monitored_barrier`` on an ftcomm
group.

torch's ``dist.monitored_barrier`` refuses every backend but gloo by name (torch 2.13:
"monitored_barrier is only implemented for GLOO backend"), so ftcomm groups are monitored through
``ftcomm.torch.monitored_barrier`` (or the group's own ``monitored_barrier`` method), with gloo's
semantics:

- every rank but group rank 0 sends rank 0 a token (8 bytes: the barrier's number), then waits
  for rank 0's token back;
- rank 0 receives every token, each within ``timeout``, and only when all came sends its tokens
  back. Otherwise it raises naming the first rank that did not report (every such rank with
  ``wait_all_ranks``), and the others, never answered, raise at their own deadline.

So a rank hung outside ftcomm is named on rank 0, not fenced. A dead rank is named too, as a
``ProcFailedError``. The tokens use ftcomm's own tag (``Tag.MONITORED_BARRIER``), not a user's.

Each token carries the number of the monitored barrier it belongs to (counted per communicator on
every rank). A token that comes too late for its barrier (a late rank's, after rank 0 gave up, or
rank 0's answer after the rank gave up; Open MPI cannot cancel a send) is still delivered to the
next monitored barrier's receive, which drops it and receives again.
"""
from __future__ import annotations

import time
import weakref

import torch

from ...core.codes import Tag
from ...errors import CollectiveTimeoutError, FtError, ProcFailedError
from . import p2p
from .device import Staging

_ROOT = 0
_LAST_CHANCE_S = 0.05  # a receive re-posted at the deadline still takes a token already here
_calls: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # communicator -> barriers begun


def monitored_barrier(comm, timeout: float, wait_all_ranks: bool = False) -> None:
    """Blocks until every rank of ``comm`` (an ftcomm ``Communicator``) reached it, or raises.

    Args:
        timeout: seconds rank 0 waits for the other ranks' tokens, and each other rank for rank
            0's answer.
        wait_all_ranks: rank 0 names every rank that did not report, not only the first.

    Raises:
        CollectiveTimeoutError: on rank 0, the ranks that did not report within ``timeout``
            ("Rank(s) R failed to pass monitoredBarrier in T ms", gloo's words); on the others,
            rank 0 did not answer (it raised, or is late itself). A zero timeout: at once, on
            every rank ("Rank R timed out in monitoredBarrier after 0 ms").
        ProcFailedError: a rank it waited for died (``failed_ranks``: their group ranks). The
            group is not rebuilt here: its next collective finds the failure and recovers.
        RevokedError: another rank's collective found a failure and revoked the communicator.
    """
    if comm.size == 1:
        return
    number = _calls.get(comm, 0) + 1
    _calls[comm] = number
    if timeout <= 0:  # gloo's answer to a zero timeout: this rank timed out at once
        raise CollectiveTimeoutError(f"monitored_barrier on world rank {comm.world_rank}: Rank {comm.rank} timed "
                                     "out in monitoredBarrier after 0 ms")
    deadline = time.monotonic() + timeout
    if comm.rank != _ROOT:
        try:
            _send_token(comm, _ROOT, number, timeout).wait()
            _receive_token(comm, _ROOT, number, deadline, _post_receive(comm, _ROOT, deadline))
        except CollectiveTimeoutError as error:
            raise CollectiveTimeoutError(
                f"monitored_barrier on world rank {comm.world_rank}: rank 0 (world rank {comm.world_ranks[_ROOT]}) "
                f"did not answer within {timeout:g} s: it named ranks that did not report, or is late itself "
                f"({error})") from None
        return
    # Every receive is waited for to its end, whatever another one raised, so that none is left
    # posted to take the token of a later monitored barrier.
    posted = {peer: _post_receive(comm, peer, deadline) for peer in range(1, comm.size)}
    missing: dict[int, FtError] = {}
    other = None
    for peer, first in posted.items():
        try:
            _receive_token(comm, peer, number, deadline, first)
        except (CollectiveTimeoutError, ProcFailedError) as error:
            missing[peer] = error
        except FtError as error:  # revoked by another collective's failure, or an MPI error
            other = other or error
    if other is not None:
        raise other
    if missing:
        raise _missing_error(comm, missing, timeout, wait_all_ranks)
    for work in [_send_token(comm, peer, number, timeout) for peer in range(1, comm.size)]:
        work.wait()


def _send_token(comm, peer: int, number: int, timeout: float):
    token = torch.tensor([number], dtype=torch.int64)
    return p2p.post(comm, token, peer, int(Tag.MONITORED_BARRIER), True, timeout, Staging(inputs=[token]))


def _post_receive(comm, peer: int, deadline: float):
    """A receive of ``peer``'s next token, posted now: (its Work, the token tensor)."""
    token = torch.zeros(1, dtype=torch.int64)
    left = max(deadline - time.monotonic(), _LAST_CHANCE_S)
    return p2p.post(comm, token, peer, int(Tag.MONITORED_BARRIER), False, left, Staging(outputs=[token])), token


def _receive_token(comm, peer: int, number: int, deadline: float, posted) -> None:
    """Waits for ``peer``'s token of barrier ``number`` (``posted``: the first receive) by
    ``deadline``, dropping older ones."""
    while True:
        work, token = posted
        work.wait()
        if int(token) >= number:
            return
        posted = _post_receive(comm, peer, deadline)


def _missing_error(comm, missing: dict, timeout: float, wait_all_ranks: bool) -> FtError:
    named = sorted(missing) if wait_all_ranks else [min(missing)]
    dead = [peer for peer in named if isinstance(missing[peer], ProcFailedError)]
    who = ", ".join(map(str, named))
    message = (f"monitored_barrier on world rank {comm.world_rank}: {'Ranks' if len(named) > 1 else 'Rank'} {who} "
               f"failed to pass monitoredBarrier in {timeout * 1000:.0f} ms (world rank(s) "
               f"{[comm.world_ranks[p] for p in named]}{'; died: ' + str(dead) if dead else ''})")
    if dead:
        return ProcFailedError(message, failed_ranks=dead)
    return CollectiveTimeoutError(message)
