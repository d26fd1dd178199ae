"""Job (4 ranks): DDP training through ``ftcomm.torch.resilient`` while FTCOMM_FAULT kills a rank
in a gradient bucket's allreduce (or flips bits: silent corruption). Reports every applied batch's sample ids (to check that no sample
of an epoch is lost or used twice), that gradients after the recovery are averaged over the new
world size, that survivors hold identical parameters, and the final training accuracy."""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from harness import ddp_toy_data, report

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=384)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--check-every", type=int, default=0)
parser.add_argument("--fence-window", type=int, default=1000)
parser.add_argument("--grad-outliers", choices=["log", "redo"], default=None)
parser.add_argument("--outlier-ratio", type=float, default=100.0)
parser.add_argument("--loader-per-epoch", action="store_true", help="build resilient(...) anew every epoch")
args = parser.parse_args()

dist.init_process_group("ftcomm")
pg = dist.group.WORLD
world_rank = pg.comm.world_rank

X, Y, sampler, loader = ddp_toy_data(args.samples, args.batch)

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
ddp = DDP(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)


def resilient():
    return ftcomm.torch.resilient(loader, model=ddp, optimizer=opt, check_every=args.check_every,
                                  fence_window=args.fence_window, grad_outliers=args.grad_outliers,
                                  outlier_ratio=args.outlier_ratio)


batches = resilient()
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    if args.loader_per_epoch and epoch:
        batches = resilient()
    for x, y, idx in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        report(kind="batch", epoch=epoch, size=dist.get_world_size(), skipped=batches.step_skipped,
               idx=idx.tolist())

# After the recovery: the same batch on every rank must give DDP gradients equal to the local
# gradient (the average over the new world size), not (N-1)/N of it.
probe_x, probe_y = X[:32], Y[:32]
opt.zero_grad()
nn.functional.cross_entropy(ddp(probe_x), probe_y).backward()
ddp_grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
nn.functional.cross_entropy(model(probe_x), probe_y).backward()
local_grads = [p.grad.clone() for p in model.parameters()]
avg_err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ddp_grads, local_grads))

with torch.no_grad():
    accuracy = (model(X).argmax(1) == Y).float().mean().item()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
report(kind="final", size=dist.get_world_size(), rank=dist.get_rank(), applied=batches.steps_applied,
       redone=batches.steps_redone, accuracy=accuracy, params=digest, avg_err=avg_err,
       sampler=[sampler.rank, sampler.num_replicas],
       recoveries=[(e.lost_world_ranks, e.old_size, e.new_size, e.where, e.step)
                   for e in ftcomm.torch.recoveries()],
       corruptions=[(e.step, e.ranks, e.action) for e in ftcomm.corruptions()])
