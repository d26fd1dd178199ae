"""Fault-matrix job: DDP through ``ftcomm.torch.resilient`` with the step-level commit (several
gradient buckets per step, committed by one agreement before the optimizer step) while
FTCOMM_FAULT fails a rank in a bucket's allreduce or at the step agreement.

Reports "iter" for every iteration (whether its optimizer step was voided, and a digest of the
parameters before and after it), "done" at the end (applied and redone steps, the final digest,
the recoveries). Usage: matrix_ddp.py
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ftcomm.torch
from harness import report

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


iteration = 0
for x, y in loader:
    iteration += 1
    before = digest()
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    report(event="iter", it=iteration, skipped=loader.step_skipped, before=before, after=digest(),
           size=dist.get_world_size())
report(event="done", applied=loader.steps_applied, redone=loader.steps_redone, digest=digest(),
       size=dist.get_world_size(),
       recoveries=[[e.lost_world_ranks, e.where, e.recover_s] for e in ftcomm.torch.recoveries()])
