"""Job (3 ranks): subgroups made in an order where some ranks are not members of some groups,
as torch allows (``dist.new_group([1, 2])`` then ``dist.new_group()``, then more), each used
for an all_reduce of each member's world rank + 1. Reports each group's sum on each member. Then
every subgroup is destroyed, a new one is made over the same members as the first and used, and
the world group still reduces; reports the groups' names and what torch still knows of them."""
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
names = [g.group_name for g in groups if g is not dist.GroupMember.NON_GROUP_MEMBER]
for group in groups:
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(group)
again = dist.new_group(orders[0])
value = torch.tensor([float(me + 1)])
if me in orders[0]:
    dist.all_reduce(value, group=again)
world = torch.tensor([float(me + 1)])
dist.all_reduce(world)
known = dist.distributed_c10d._world.pg_names
report(kind="destroyed", world_name=dist.group.WORLD.group_name, names=names,
       still_known=sorted(n for g, n in known.items() if g is not dist.group.WORLD),
       again_sum=value.item(), world_sum=world.item())
dist.destroy_process_group()
