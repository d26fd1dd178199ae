"""Job (4 ranks): one rooted, all-to-all, coalesced or sparse collective of the ftcomm backend
(--op), called plainly (outside any resilient loop) 6 times; at the 4th a rank (--victim, a world rank) dies (--how kill)
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
parser.add_argument("--op", required=True, choices=("reduce", "gather", "scatter", "all_to_all_single", "all_to_all",
                                                    "all_gather_coalesced", "all_gather_into_tensor_coalesced",
                                                    "sparse_all_reduce"))
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
    if args.op == "all_to_all":
        ins = [torch.full((w + 1,), 100.0 * ME + w) for w in members]
        outs = [torch.empty(ME + 1) for _ in members]
        dist.all_to_all(outs, ins)
        return all(o.eq(100.0 * w + ME).all().item() for w, o in zip(members, outs))
    if args.op == "all_gather_coalesced":
        ins = [torch.full((2,), float(ME)), torch.full((3,), -float(ME))]
        outs = [[torch.empty(2), torch.empty(3)] for _ in members]
        dist.all_gather_coalesced(outs, ins)
        return all(a.eq(w).all().item() and b.eq(-w).all().item() for w, (a, b) in zip(members, outs))
    if args.op == "all_gather_into_tensor_coalesced":
        outs = [torch.empty(n * 2), torch.empty(n * 3)]
        with dist._coalescing_manager():
            dist.all_gather_into_tensor(outs[0], torch.full((2,), float(ME)))
            dist.all_gather_into_tensor(outs[1], torch.full((3,), -float(ME)))
        return (torch.equal(outs[0], torch.tensor([float(w) for w in members]).repeat_interleave(2))
                and torch.equal(outs[1], torch.tensor([-float(w) for w in members]).repeat_interleave(3)))
    # sparse_all_reduce: each member sets column ME of row 0 and row ME + 1 of column 0
    t = torch.sparse_coo_tensor(torch.tensor([[0, ME + 1], [ME, 0]]), torch.tensor([1.0, float(ME)]), (6, 6))
    dist.all_reduce(t)
    want = torch.zeros(6, 6)
    for w in members:
        want[0, w] += 1.0
        want[w + 1, 0] += float(w)
    return torch.equal(t.to_dense(), want)


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
