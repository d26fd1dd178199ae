"""Job (4 active ranks + spares, ``ftcomm-run --spares S``): a stock DDP loop on the ftcomm torch
backend, written the way spares need it (``resilient(loader, model=, optimizer=)`` and
``loader.epochs(E)``), while FTCOMM_FAULT kills ranks in gradient allreduces. A promoted spare
starts this script inside ``import ftcomm.torch`` and joins the survivors at their step.

Reports "batch" (every batch: epoch, applied or voided, sample ids, world size), "joined" (a
newcomer, right after the hand-over: digests of the state it received), "handed" (the state a
survivor handed over, same digests), and "final" (digests of parameters, optimizer state and RNG;
counters; recoveries). With --mode per-epoch the loop is the old ``for epoch in range(E)`` form,
which a job with spares must refuse on every rank ("refused").
"""
import argparse
import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch  # a spare waits in here until it is promoted
from harness import ddp_toy_data, report

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=384)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--mode", choices=["epochs", "per-epoch"], default="epochs")
parser.add_argument("--newcomer-setup-s", type=float, default=0.0,
                    help="a promoted spare sleeps this long before building its model (a slow set-up)")
parser.add_argument("--newcomer-width", type=int, default=64,
                    help="hidden width of a promoted spare's model (not 64: a script that disagrees)")
args = parser.parse_args()

dist.init_process_group("ftcomm")
pg = dist.group.WORLD
if pg.joining:
    time.sleep(args.newcomer_setup_s)

_, _, sampler, data = ddp_toy_data(args.samples, args.batch)

width = args.newcomer_width if pg.joining else 64
model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 4))
ddp = DDP(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
loader = ftcomm.torch.resilient(data, model=ddp, optimizer=opt, extra_state=[sched])


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def digests() -> dict:
    moments = [s[k] for s in opt.state.values() for k in sorted(s)]
    return {"params": digest(model.parameters()), "optimizer": digest(moments),
            "rng": digest([torch.get_rng_state()]), "lr": sched.get_last_lr()[0]}


def train_step(x, y):
    opt.zero_grad()
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    if not loader.step_skipped:
        sched.step()


first_step = None  # a newcomer's step count when it joined


def epochs():
    global first_step
    if args.mode == "epochs":
        for epoch in loader.epochs(args.epochs):
            if first_step is None:
                first_step = loader.steps_applied + loader.steps_redone
            yield epoch
        return
    for epoch in range(args.epochs):  # the shrink-only form: refused with spares
        sampler.set_epoch(epoch)
        yield epoch


try:
    for epoch in epochs():
        for x, y, idx in loader:
            if loader.joined and loader.steps_applied + loader.steps_redone == first_step:
                report(kind="joined", rank=dist.get_rank(), epoch=epoch, applied=loader.steps_applied,
                       **digests())  # the state the hand-over gave this newcomer
            elif loader.last_step_skipped:
                report(kind="handed", rank=dist.get_rank(), epoch=epoch, applied=loader.steps_applied,
                       **digests())  # a survivor's state after the voided step (what it handed over)
            train_step(x, y)
            report(kind="batch", epoch=epoch, size=dist.get_world_size(), skipped=loader.step_skipped,
                   idx=idx.tolist())
except ValueError as exc:  # ftcomm.InvalidInputError is one too
    report(kind="refused", error=str(exc), type=type(exc).__name__)
    raise SystemExit(3)

position = {p.data_ptr(): i for i, p in enumerate(model.parameters())}
buckets = [[position[p.data_ptr()] for p in b.parameters()] for b in ddp.reducer._get_zeros_like_grad_buckets()]
report(kind="final", rank=dist.get_rank(), size=dist.get_world_size(), group_ranks=dist.get_process_group_ranks(pg),
       buckets=buckets,
       applied=loader.steps_applied,
       redone=loader.steps_redone, joined=loader.joined, sampler=[sampler.rank, sampler.num_replicas],
       recoveries=[(e.lost_world_ranks, e.old_size, e.new_size, e.policy, e.promoted)
                   for e in ftcomm.torch.recoveries()], values=torch.cat([p.detach().reshape(-1) for p in
                                                                         model.parameters()]).tolist(),
       **digests())
