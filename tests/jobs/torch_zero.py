"""Job (4 ranks): DDP over the ftcomm backend with ``ftcomm.torch.ZeroRedundancyOptimizer``, two
param groups and an LR scheduler.

--mode reference: failure-free; a second copy of the model trains on the same batches with gloo
    DDP and torch's own ZeroRedundancyOptimizer; reports the largest differences of parameters and
    of the consolidated optimizer states, and whether torch's optimizer class loads ftcomm's.
--mode kill: FTCOMM_FAULT kills a rank somewhere in a step (or nothing, for a reference run);
    after each committed step every rank keeps a snapshot of the whole state (parameters and every
    state slot); after a voided step (and the hand-over, when a spare took the dead rank's place:
    ftcomm-run --spares) it reports whether the rebuilt state equals the last snapshot bitwise. At
    the end: digests and values of the parameters, a digest of the state, CRC-32 of this rank's
    shard and of each replica it keeps, and the corruption events (--check-every M scrubs the
    shards and replicas every M steps; bit flips at points shard and replica).
"""
import argparse
import hashlib
import zlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from harness import ddp_toy_data, report

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("reference", "kill"), required=True)
parser.add_argument("--optimizer", default="AdamW")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=384)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--replicas", type=int, default=1)
parser.add_argument("--check-every", type=int, default=0)
args = parser.parse_args()

dist.init_process_group("ftcomm")
world_rank = dist.group.WORLD.comm.world_rank
X, Y, sampler, loader = ddp_toy_data(args.samples, args.batch)
OPT = getattr(torch.optim, args.optimizer)
HYPER = {"AdamW": dict(lr=1e-2, weight_decay=0.05), "SGD": dict(lr=0.05, momentum=0.9),
         "Adagrad": dict(lr=0.05), "RMSprop": dict(lr=1e-3)}[args.optimizer]


def make_model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def groups(model):
    """Weights at the class's settings, biases at half the learning rate and no weight decay."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "lr": HYPER["lr"] / 2, "weight_decay": 0.0}]


model = make_model()
ddp = DDP(model)
opt = ftcomm.torch.ZeroRedundancyOptimizer(groups(model), OPT, replicas=args.replicas, **HYPER)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
batches = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt, extra_state=[sched], check_every=args.check_every)


def whole_state():
    """Parameters and every state slot, gathered (collective), as one dict of numpy arrays."""
    state = opt.sharded.gather_state()
    return {name: value.copy() for name, value in state.items()}


def digest(arrays):
    h = hashlib.sha256()
    for value in arrays:
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


if args.mode == "reference":
    gloo = dist.new_group(backend="gloo")
    ref_model = make_model()
    ref_ddp = DDP(ref_model, process_group=gloo)
    ref_opt = TorchZero(groups(ref_model), OPT, process_group=gloo, **HYPER)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=10, gamma=0.5)
    for epoch in batches.epochs(args.epochs):
        for x, y, _ in batches:
            for m, o in ((ddp, opt), (ref_ddp, ref_opt)):
                o.zero_grad()
                nn.functional.cross_entropy(m(x), y).backward()
                o.step()
            sched.step()
            ref_sched.step()
    opt.consolidate_state_dict(to=0)
    ref_opt.consolidate_state_dict(to=0)
    param_diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref_model.parameters()))
    result = dict(kind="reference", param_diff=param_diff, steps=batches.steps_applied,
                  lr=[g["lr"] for g in opt.param_groups], ref_lr=[g["lr"] for g in ref_opt.param_groups])
    if dist.get_rank() == 0:
        mine, theirs = opt.state_dict(), ref_opt.state_dict()
        result["state_keys"] = sorted(mine["state"]) == sorted(theirs["state"])
        result["state_diff"] = max((mine["state"][i][k].float() - theirs["state"][i][k].float()).abs().max().item()
                                   for i in theirs["state"] for k in theirs["state"][i])
        result["groups_equal"] = [{k: v for k, v in g.items()} for g in mine["param_groups"]] == \
            [{k: v for k, v in g.items()} for g in theirs["param_groups"]]
        plain = OPT(groups(make_model()), **HYPER)
        plain.load_state_dict(mine)
        result["torch_loads_it"] = all(
            torch.equal(plain.state[p][k], mine["state"][i][k])
            for i, p in enumerate(q for g in plain.param_groups for q in g["params"]) for k in mine["state"][i])
    report(**result)
else:
    newcomer = dist.group.WORLD.joining  # a promoted spare (ftcomm-run --spares): holds nothing yet
    snapshot = None if newcomer else whole_state()
    rebuilt_equal = []
    for epoch in batches.epochs(args.epochs):
        for x, y, idx in batches:
            if batches.last_step_skipped or newcomer:
                # after a voided step (and, with a spare, its hand-over): every rank holds the
                # last committed state again, rebuilt from owners and replicas
                after = whole_state()
                if snapshot is not None:
                    rebuilt_equal.append(all(np.array_equal(after[k], snapshot[k]) for k in snapshot))
                    report(kind="voided", size=dist.get_world_size(), equal=rebuilt_equal[-1],
                           rebuild=opt.last_rebuild and {k: opt.last_rebuild[k]
                                                         for k in ("from_replica", "old_size", "new_size")})
                newcomer = False
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if not batches.step_skipped:
                sched.step()
                snapshot = whole_state()
    state = whole_state()
    engine = opt.sharded
    with torch.no_grad():
        accuracy = (model(X).argmax(1) == Y).float().mean().item()
    plane = dist.group.WORLD.data_plane
    report(kind="final", size=dist.get_world_size(), rank=dist.get_rank(), applied=batches.steps_applied,
           plane=plane.name, plane_completed=dict(getattr(plane, "completed", {})),
           redone=batches.steps_redone, rebuilt_equal=rebuilt_equal, accuracy=accuracy,
           params=digest(p.detach().numpy() for p in model.parameters()),
           state=digest(state[k] for k in sorted(state)), step_id=engine.step_id,
           live_crc=zlib.crc32(engine.live.tobytes()),
           replica_crcs={str(s): zlib.crc32(r.state.tobytes()) for s, r in engine.store.committed.items()},
           joined=batches.joined, values=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(),
           recoveries=[(e.lost_world_ranks, e.old_size, e.new_size, e.where) for e in ftcomm.torch.recoveries()],
           corruptions=[(e.step, e.ranks, e.action) for e in ftcomm.corruptions()])
