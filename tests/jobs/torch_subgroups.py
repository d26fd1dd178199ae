"""Job (3 ranks): subgroups made in an order where some ranks are not members of some groups,
as torch allows (``dist.new_group([1, 2])`` then ``dist.new_group()``, then more), each used
for an all_reduce of each member's world rank + 1. Reports each group's sum on each member."""
import torch
import torch.distributed as dist

import ftcomm.torch  # noqa: F401
from harness import report

dist.init_process_group("ftcomm")
me = dist.get_rank()
orders = [[1, 2], [0, 1, 2], [0, 2], [1, 2], [0, 1]]
groups = [dist.new_group(members) for members in orders]
for members, group in zip(orders, groups):
    if me in members:
        value = torch.tensor([float(me + 1)])
        dist.all_reduce(value, group=group)
        report(members=members, sum=value.item())
dist.destroy_process_group()
