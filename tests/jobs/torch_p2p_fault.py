"""Job (4 ranks): point-to-point on the ftcomm backend with a rank lost. World rank 2 (--how kill:
SIGKILL; stop: SIGSTOP, fenced by its peers) dies instead of sending to rank 1 in the 3rd round of
a ring exchange (each rank isends to the next and irecvs from the one before, in either order);
with --anysource world rank 0 also waits for one message from any rank, which only rank 2 would
have sent. Every survivor reports what its point-to-point operations raised and how long they
took; once rank 0 has said go (a message to each), the group's next all_reduce (ProcFailedError once, the group rebuilt) and its retry,
and a last ring exchange over the survivors, each against the values the members should get.
--unmatched (2 ranks): nobody dies; each rank waits for a message the other never sends, and
reports the error and how long it took (the group's timeout; the peer is alive and beating, so
it is not fenced). Then rank 0 sends 4 MiB that rank 1 receives only after the send timed out
(Open MPI cannot cancel a send: the message is still delivered, the same bytes), then a ring
exchange."""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import ftcomm
import ftcomm.torch  # noqa: F401
from harness import report

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=("kill", "stop"), default="kill")
parser.add_argument("--anysource", action="store_true")
parser.add_argument("--unmatched", action="store_true")
args = parser.parse_args()
VICTIM = 2

dist.init_process_group("ftcomm")
pg = dist.group.WORLD
ME = pg.comm.world_rank


def ring_exchange(step: int) -> tuple[list, bool]:
    """One round: errors of this rank's send and receive, and whether what arrived is right."""
    r, n = dist.get_rank(), dist.get_world_size()
    members = pg.comm.world_ranks
    x, y = torch.full((50_000,), 1000.0 * step + ME), torch.empty(50_000)
    ops = [dist.P2POp(dist.isend, x, (r + 1) % n, tag=step), dist.P2POp(dist.irecv, y, (r - 1) % n, tag=step)]
    if r % 2:
        ops.reverse()
    errors = []
    for work in dist.batch_isend_irecv(ops):
        try:
            work.wait()
        except ftcomm.FtError as exc:
            errors.append(type(exc).__name__)
    return errors, not errors and bool(y.eq(1000.0 * step + members[(r - 1) % n]).all())


def late_send() -> dict:
    """Rank 0's 4 MiB send times out (rank 1 has not posted its receive); then rank 1 receives
    it. What rank 0's send raised, and whether rank 1 got the bytes sent."""
    sent = torch.arange(1 << 20, dtype=torch.float32)
    flag = torch.zeros(1)
    if ME == 0:
        try:
            dist.send(sent, 1, tag=66)
            error = None
        except ftcomm.FtError as exc:
            error = {"type": type(exc).__name__, "text": str(exc)}
        dist.send(flag, 1, tag=67)  # "my send has timed out"
        return {"error": error}
    for _ in range(20):  # each try lasts the group's timeout (3 s)
        try:
            dist.recv(flag, 0, tag=67)
            break
        except ftcomm.CollectiveTimeoutError:
            continue
    got = torch.empty_like(sent)
    dist.recv(got, 0, tag=66)
    return {"equal": torch.equal(got, sent)}


if args.unmatched:
    start, error = time.monotonic(), None
    try:  # each waits for the other, under a tag the other never sends on
        dist.recv(torch.empty(3), src=1 - ME, tag=55 + ME)
    except ftcomm.FtError as exc:
        error = {"type": type(exc).__name__, "text": str(exc)}
    dist.barrier()
    report(kind="unmatched", error=error, s=round(time.monotonic() - start, 2), late_send=late_send(),
           ring=ring_exchange(1))
    dist.destroy_process_group()
    raise SystemExit(0)
rounds = []
for step in range(4):
    if step == 2 and ME == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL if args.how == "kill" else signal.SIGSTOP)
    start = time.monotonic()
    errors, right = ring_exchange(step)
    rounds.append({"errors": errors, "right": right, "s": round(time.monotonic() - start, 2)})
anysource = None
if args.anysource and ME == 0:
    start = time.monotonic()
    try:
        dist.recv(torch.empty(3), tag=77)
        anysource = {"error": None}
    except ftcomm.FtError as exc:
        anysource = {"error": type(exc).__name__, "failed": exc.failed_ranks}
    anysource["s"] = round(time.monotonic() - start, 2)
# No survivor runs a collective before rank 0 says so (a collective that finds the dead rank
# revokes the communicator, and point-to-point still pending elsewhere would then be revoked).
go = torch.zeros(1)
if ME == 0:
    for peer in range(1, dist.get_world_size()):
        dist.send(go, peer, tag=88)
else:
    dist.recv(go, 0, tag=88)
after = {}
t = torch.full((4,), float(ME + 1))
try:
    dist.all_reduce(t)
    after["first"] = None
except ftcomm.ProcFailedError as exc:
    after["first"] = type(exc).__name__
    t = torch.full((4,), float(ME + 1))
    dist.all_reduce(t)
after["sum"] = t[0].item()
after["ring"] = ring_exchange(9)
report(kind="final", rank=dist.get_rank(), size=dist.get_world_size(), rounds=rounds, anysource=anysource,
       after=after)
dist.destroy_process_group()
