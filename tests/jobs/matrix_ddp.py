"""Fault-matrix job: DDP through ``ftcomm.torch.resilient`` with the step-level commit (several
gradient buckets per step, committed by one agreement before the optimizer step) while
FTCOMM_FAULT fails a rank in a bucket's allreduce or at the step agreement.

Reports "iter" for every iteration (whether its optimizer step was voided, a digest of the
parameters before and after it; with --loss-allreduce, the loss averaged by a user allreduce
between backward and the optimizer step, which commits on its own: the same on every survivor,
even in a voided step), "done" at the end (applied and redone steps, the final digest,
the recoveries, each with its detection time). With --late-rank R --late-s T, world rank R sleeps T seconds before the
optimizer step of iteration 3; an error out of the optimizer step is reported ("error") and ends
the rank. Usage: matrix_ddp.py [--loss-allreduce] [--late-rank R --late-s T]
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ftcomm
import ftcomm.torch
from harness import report

parser = argparse.ArgumentParser()
parser.add_argument("--loss-allreduce", action="store_true")
parser.add_argument("--late-rank", type=int, default=-1)
parser.add_argument("--late-s", type=float, default=0.0)
args = parser.parse_args()
dist.init_process_group("ftcomm")
world_rank = dist.get_rank()
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(192, 16, generator=gen), torch.randint(0, 10, (192,), generator=gen))
dist._DEFAULT_FIRST_BUCKET_BYTES = 8 << 10  # small buckets from the first step: several per step
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)),
            bucket_cap_mb=0.01)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sampler = DistributedSampler(data, shuffle=False)
loader = ftcomm.torch.resilient(DataLoader(data, batch_size=4, sampler=sampler))


def digest() -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]


iteration, starts = 0, []
for x, y in loader:
    iteration += 1
    starts.append(time.time())
    before = digest()
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    mean_loss = loss.detach().clone()
    if args.loss_allreduce:
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
    if iteration == 3 and world_rank == args.late_rank:
        time.sleep(args.late_s)
    try:
        opt.step()
    except ftcomm.FtError as error:
        report(event="error", it=iteration, type=type(error).__name__, message=str(error))
        sys.stdout.flush()
        os._exit(0)  # the communicator cannot be trusted to shut down in order
    report(event="iter", it=iteration, skipped=loader.step_skipped, before=before, after=digest(),
           loss=mean_loss.item() if args.loss_allreduce else None, size=dist.get_world_size())
report(event="done", applied=loader.steps_applied, redone=loader.steps_redone, digest=digest(),
       size=dist.get_world_size(),
       recoveries=[[e.lost_world_ranks, e.where, e.recover_s,
                    # from the start of the iteration that saw the failure to the error (an upper bound)
                    e.detected_time - max(t for t in starts if t <= e.detected_time)]
                   for e in ftcomm.torch.recoveries()])
