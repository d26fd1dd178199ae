"""Job (4 ranks): plain ``dist.reduce_scatter_tensor`` calls on the ftcomm backend, outside any
resilient loop, while FTCOMM_FAULT kills a rank inside the ring. The failed collective raises
ProcFailedError on every survivor with input and output untouched; the retry on the rebuilt group
(3 ranks, larger blocks) gives the survivors' sum."""
import torch
import torch.distributed as dist

import ftcomm
import ftcomm.torch
from harness import report

dist.init_process_group("ftcomm")
world_rank = dist.group.WORLD.comm.world_rank
BLOCK = 120  # divisible by 4 and by 3 after the shrink: the input keeps its length
failures, results = [], []
for step in range(6):
    n = dist.get_world_size()
    x = torch.arange(BLOCK * 4, dtype=torch.float32) * (world_rank + 1)
    out = torch.full((BLOCK * 4 // n,), -7.0)
    try:
        dist.reduce_scatter_tensor(out, x)
    except ftcomm.ProcFailedError as exc:
        untouched = bool(torch.equal(out, torch.full_like(out, -7.0))
                         and torch.equal(x, torch.arange(BLOCK * 4, dtype=torch.float32) * (world_rank + 1)))
        failures.append({"step": step, "exc_step": exc.step, "untouched": untouched, "size_after": dist.get_world_size()})
        n = dist.get_world_size()
        out = torch.full((BLOCK * 4 // n,), -7.0)
        dist.reduce_scatter_tensor(out, x)  # the retry, on the rebuilt group
    weights = sum(w + 1 for w in dist.group.WORLD.comm.world_ranks)  # over the world ranks alive
    r, k = dist.get_rank(), out.numel()
    expected = torch.arange(BLOCK * 4, dtype=torch.float32)[r * k:(r + 1) * k] * weights
    results.append(bool(torch.equal(out, expected)))
report(kind="final", rank=dist.get_rank(), size=dist.get_world_size(), failures=failures, results=results)
