"""Job (4 ranks): DDP on the default ftcomm group plus a subgroup of every rank made at start-up
(``dist.new_group``), used each step to sum a count of ranks; FTCOMM_FAULT kills a rank in a
gradient bucket's allreduce. Both groups must recover (each over its own communicator) and every
applied step's subgroup sum must equal the number of ranks that took part. Reports each applied
step's sum and group sizes, and the final parameters' digest."""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from harness import ddp_toy_data, report

dist.init_process_group("ftcomm")
sub = dist.new_group(list(range(dist.get_world_size())))
X, Y, sampler, loader = ddp_toy_data(256, 8)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
batches = ftcomm.torch.resilient(loader)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y, idx in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        ones = torch.ones(1)
        dist.all_reduce(ones, group=sub)
        opt.step()
        if not batches.step_skipped:
            report(kind="step", epoch=epoch, ranks=int(ones.item()), size=dist.get_world_size(),
                   sub_size=sub.size())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
report(kind="final", size=dist.get_world_size(), sub_size=sub.size(), params=digest,
       recoveries=[(e.lost_world_ranks, e.where) for e in ftcomm.torch.recoveries()])
