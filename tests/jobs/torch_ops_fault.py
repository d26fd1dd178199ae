"""Job (4 ranks): one rooted or all-to-all collective of the ftcomm backend (--op), called plainly
(outside any resilient loop) 6 times; at the 4th a rank (--victim, a world rank) dies (--how kill)
or stops (--how stop: SIGSTOP, fenced by the survivors) just as the others enter the collective.
Each survivor reports the error it got (ProcFailedError, on the rebuilt group) and whether every
result, before and after, equals what the members of the group at that time should get (values
built from the world ranks, so the reference needs no communication)."""
import argparse
import os
import signal

import torch
import torch.distributed as dist

import ftcomm
import ftcomm.torch  # noqa: F401  (registers "ftcomm")
from harness import report

parser = argparse.ArgumentParser()
parser.add_argument("--op", required=True, choices=("reduce", "gather", "scatter", "all_to_all_single", "all_to_all"))
parser.add_argument("--victim", type=int, default=2)
parser.add_argument("--how", choices=("kill", "stop"), default="kill")
parser.add_argument("--at", type=int, default=3)
args = parser.parse_args()

dist.init_process_group("ftcomm")
pg = dist.group.WORLD
ME = pg.comm.world_rank


def run_once() -> bool:
    """The collective over the current members; whether this rank's result is the reference."""
    members, r = pg.comm.world_ranks, dist.get_rank()
    n = len(members)
    if args.op == "reduce":
        t = torch.full((5,), float(ME + 1))
        dist.reduce(t, dst=0)
        return t.eq(sum(w + 1 for w in members) if r == 0 else ME + 1).all().item()
    if args.op == "gather":
        outs = [torch.empty(3) for _ in range(n)] if r == 0 else None
        dist.gather(torch.full((3,), float(ME)), outs, dst=0)
        return r != 0 or all(o.eq(members[j]).all().item() for j, o in enumerate(outs))
    if args.op == "scatter":
        ins = [torch.full((2,), 10.0 * w + members[0]) for w in members] if r == 0 else None
        got = torch.empty(2)
        dist.scatter(got, ins, src=0)
        return got.eq(10.0 * ME + members[0]).all().item()
    if args.op == "all_to_all_single":
        x = torch.tensor([[100.0 * ME + w] * 2 for w in members])
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        return torch.equal(out, torch.tensor([[100.0 * w + ME] * 2 for w in members]))
    ins = [torch.full((w + 1,), 100.0 * ME + w) for w in members]
    outs = [torch.empty(ME + 1) for _ in members]
    dist.all_to_all(outs, ins)
    return all(o.eq(100.0 * w + ME).all().item() for w, o in zip(members, outs))


failures, correct = [], []
for i in range(6):
    if i == args.at and ME == args.victim:
        os.kill(os.getpid(), signal.SIGKILL if args.how == "kill" else signal.SIGSTOP)
    try:
        correct.append(run_once())
    except ftcomm.ProcFailedError as exc:
        failures.append({"at": i, "type": type(exc).__name__, "size_after": dist.get_world_size()})
        correct.append(run_once())  # the retry, on the rebuilt group
report(kind="final", rank=dist.get_rank(), size=dist.get_world_size(), failures=failures, correct=correct,
       ranks=dist.get_process_group_ranks(pg))
dist.destroy_process_group()
