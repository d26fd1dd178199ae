"""Job (4 ranks): DDP over the ftcomm backend outside any resilient loop while FTCOMM_FAULT kills a
rank in a gradient allreduce. The survivors' backward raises (a RuntimeError from DDP's reducer
carrying the ProcFailedError's message: torch's C++ future keeps only the text), the group is
already rebuilt over the survivors, and later iterations' gradients are the survivors' mean."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch  # noqa: F401
from harness import report

dist.init_process_group("ftcomm")
world_rank = dist.group.WORLD.comm.world_rank
torch.manual_seed(0)
model = nn.Linear(4, 1, bias=False)
ddp = DDP(model)
errors, grads = [], []
for step in range(5):
    model.zero_grad()
    x = torch.full((1, 4), float(world_rank + 1))  # d(sum of outputs)/dw = x: the gradient is the mean x
    try:
        ddp(x).sum().backward()
    except RuntimeError as exc:
        errors.append({"step": step, "names_it": "ProcFailedError" in str(exc), "size_after": dist.get_world_size()})
        continue
    grads.append(model.weight.grad[0, 0].item())
report(kind="final", errors=errors, grads=grads, size=dist.get_world_size())
