"""Job (4 ranks): plain ``dist.all_reduce`` calls on the ftcomm backend, outside any resilient
loop, while FTCOMM_FAULT kills a rank (world rank 0, which also hosts torch's TCP store). The
failed collective raises ProcFailedError on every survivor, the group is already rebuilt over the
survivors (renumbered ranks, new size), and retrying gives the survivors' result."""
import torch
import torch.distributed as dist

import ftcomm
import ftcomm.torch
from harness import report

dist.init_process_group("ftcomm")
pg = dist.group.WORLD
world_rank = pg.comm.world_rank
failures = []
results = []
for step in range(6):
    t = torch.full((1000,), float(world_rank + 1))
    try:
        dist.all_reduce(t)
    except ftcomm.ProcFailedError as exc:
        failures.append({"step": step, "type": type(exc).__name__, "exc_step": exc.step,
                         "size_after": dist.get_world_size()})
        t = torch.full((1000,), float(world_rank + 1))
        dist.all_reduce(t)  # the retry, on the rebuilt group
    results.append(t[0].item())
b = torch.tensor([float(world_rank)]) if dist.get_rank() == 0 else torch.zeros(1)
dist.broadcast(b, src=0)
dist.barrier()
report(kind="final", rank=dist.get_rank(), size=dist.get_world_size(), failures=failures, results=results,
       bcast=b.item(), generation=pg.generation, ranks=dist.get_process_group_ranks(pg))
