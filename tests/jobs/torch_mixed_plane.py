"""Job (3 ranks): world rank 1 alone sets FTCOMM_DATA_PLANE=gloo, the others keep the ring, and all
train DDP through ``ftcomm.torch.resilient``. Reports, per rank, the error the first step raised
(DDP's reducer carries its text) and whether the parameters are still the initial ones, bitwise."""
import os

from mpi4py import MPI

if MPI.COMM_WORLD.Get_rank() == 1:  # before ftcomm reads its settings
    os.environ["FTCOMM_DATA_PLANE"] = "gloo"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ftcomm.torch  # noqa: E402
from harness import ddp_toy_data, report  # noqa: E402

dist.init_process_group("ftcomm")
_, _, _, loader = ddp_toy_data(48, 8)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
initial = [p.detach().clone() for p in model.parameters()]
error = None
try:
    for x, y, _ in ftcomm.torch.resilient(loader, model=ddp, optimizer=opt):
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
except Exception as exc:  # noqa: BLE001 - the test reads which one
    error = f"{type(exc).__name__}: {exc}"
report(kind="final", error=error, unchanged=all(torch.equal(p, q) for p, q in zip(model.parameters(), initial)))
