"""Job (2 ranks): how the members of an inner data-plane group give up on it together
(ftcomm/torch/group/inner_group.py), with gloo as the inner group.

The planes here keep the aborted gloo group alive (``KeptOpen``): its connections stay open, as
NCCL's stay between the processes of one host, so a collective can only end through ftcomm's own
signals, not through gloo noticing a closed connection.

- "thread": both ranks allreduce once (checked against the sum), then rank 0 starts an allreduce
  that rank 1 never joins, and another thread of rank 0 calls ``abort()``: the allreduce raises
  ``ProcFailedError`` ("this rank aborted the group").
- "member": on a second plane, after one checked allreduce, rank 1 aborts its side; rank 0 then
  starts an allreduce that rank 1 never joins: it raises ``ProcFailedError`` ("another member
  aborted the group") at the next look, long before the deadline; the next allreduce on a new
  communicator makes a new inner group, over the same store (its rank 0 is the same) under a new
  key prefix, and is exact; so is one that rank 0 waits for (rank 1 joins it late), during which
  rank 0 looks for abort keys and must not see the old group's.
- "new rank 0": over a communicator in the other order (world rank 1 is its rank 0) the plane
  makes a new group over a new store, served by world rank 1, and it is exact.

Reports "phase" per rank and phase: the error type and text, the results, groups and stores made.
"""
import threading
import time

import torch

import ftcomm
from ftcomm.torch.group.gloo_plane import GlooPlane
from harness import report

DEADLINE = 120.0  # seconds: far past what the signals take, so that only they can end the waits
_kept = []


class KeptOpen(GlooPlane):
    def _abort_group(self, group) -> None:
        _kept.append(group)  # connections stay open: peers are not told by gloo


def summed(comm, plane) -> bool:
    t = torch.arange(8, dtype=torch.float32) * (comm.rank + 1)
    plane.allreduce(comm, [t], "sum", DEADLINE)
    expected = torch.arange(8, dtype=torch.float32) * sum(r + 1 for r in range(comm.size))
    return torch.equal(t, expected)


def pending_allreduce(comm, plane) -> dict:
    t0 = time.monotonic()
    try:
        plane.allreduce(comm, [torch.ones(4)], "sum", DEADLINE)
        return {"error": None}
    except ftcomm.FtError as error:
        return {"error": type(error).__name__, "text": str(error), "under_deadline": time.monotonic() - t0 < DEADLINE}


comm = ftcomm.Communicator(timeout=DEADLINE)

plane = KeptOpen()
exact = summed(comm, plane)
if comm.rank == 0:
    threading.Timer(0.5, plane.abort).start()
    report(kind="phase", phase="thread", exact=exact, **pending_allreduce(comm, plane))
else:
    report(kind="phase", phase="thread", exact=exact)
comm.barrier()

plane = KeptOpen()
exact = summed(comm, plane)
if comm.rank == 1:
    plane.abort()
comm.barrier()  # rank 1 has aborted: rank 0's allreduce below cannot complete
outcome = pending_allreduce(comm, plane) if comm.rank == 0 else {}
comm.barrier()
fresh = ftcomm.Communicator(timeout=DEADLINE)  # as after a recovery: a new inner group
again = summed(fresh, plane)
if fresh.rank == 1:
    time.sleep(0.6)  # rank 0 waits past a few looks at the store (inner_group._LOOK_EVERY)
waited = summed(fresh, plane)
report(kind="phase", phase="member", exact=exact, again=again, waited=waited, groups_made=plane.groups_made,
       stores_made=plane.stores_made, **outcome)
fresh.barrier()
reordered = fresh.split(0, fresh.size - 1 - fresh.rank)  # world rank 1 is its rank 0
report(kind="phase", phase="new rank 0", exact=summed(reordered, plane), groups_made=plane.groups_made,
       stores_made=plane.stores_made)
reordered.barrier()
# Rank 0's kept groups hold its abandoned allreduces until rank 1's side of them closes.
plane = None
_kept.clear()
