"""Job for the GPU check (4 ranks sharing one GPU with ``--device cuda``; ``--device cpu`` in the
check's dry run): DDP over "ftcomm" with AdamW in a resilient loop while FTCOMM_FAULT kills a
rank in a gradient allreduce. Under ``ftcomm-run --spares 1`` a spare takes its place and
receives the model and optimizer state through the hand-over (state dicts move through host
memory; the newcomer's tensors land on its own device).

``--zero``: the optimizer is ``ftcomm.torch.ZeroRedundancyOptimizer`` (on a GPU its shard's state
lives on the device, ftcomm/torch/zero/device_shard.py; ``--offload`` keeps it on the host); with a
spare, the newcomer takes its shard from a buddy's replica.

Reports "final" on every rank that finishes: world size, steps applied and redone, digests of the
parameters and the optimizer state (their bytes, copied to the host), the parameters' device, the
data plane (FTCOMM_DATA_PLANE) and the allreduces it completed here, and
with ``--zero`` whether the shard's state is on the device and equal to its host copy bitwise.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch  # a spare waits in here until it is promoted
from harness import ddp_toy_data, report

parser = argparse.ArgumentParser()
parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--zero", action="store_true", help="ftcomm.torch.ZeroRedundancyOptimizer(AdamW)")
parser.add_argument("--offload", action="store_true", help="with --zero: the shard's state on the host")
args = parser.parse_args()

if args.device == "cuda":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
else:
    device = torch.device("cpu")

dist.init_process_group("ftcomm")
_, _, _, data = ddp_toy_data(384, 8)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
ddp = DDP(model)
if args.zero:
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-2, offload=args.offload)
else:
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
loader = ftcomm.torch.resilient(data, model=ddp, optimizer=opt)


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


for epoch in loader.epochs(args.epochs):
    for x, y, _ in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
        opt.step()

shard = {}
if args.zero:  # the sharded state, gathered (collective)
    state = opt.full_state_dict()["state"]
    moments = [state[i][k] for i in sorted(state) for k in ("exp_avg", "exp_avg_sq")]
    on_device = opt.sharded.device
    shard = {"shard_on_device": on_device is not None,
             "device_matches_host": on_device is not None
             and torch.equal(on_device.live.cpu(), torch.from_numpy(opt.sharded.live))}
else:
    moments = [s[k] for s in opt.state.values() for k in sorted(s)]
plane = dist.group.WORLD.data_plane
report(kind="final", world_size=dist.get_world_size(), applied=loader.steps_applied, redone=loader.steps_redone,
       plane=plane.name, plane_allreduces=getattr(plane, "completed", {}).get("allreduce", 0),
       plane_allgathers=getattr(plane, "completed", {}).get("allgather", 0),
       params=digest(model.parameters()), optimizer=digest(moments),
       device=next(model.parameters()).device.type, joined=loader.joined, **shard)
