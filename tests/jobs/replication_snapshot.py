"""Job: train a small MLP with ShardedOptimizer (hand-written loop, no elastic driver); after every
committed step gather the full state (a snapshot); after a failure recover, rebuild and compare
the rebuilt full state bitwise with the snapshot of the last committed step.

Kills come from FTCOMM_FAULT (points train_step, shard_update, replicate, rebuild, commit...).
Reports: "rebuilt" (per recovery), "state_lost", "done".
"""
import argparse

import numpy as np
import torch

import ftcomm
from ftcomm import fault
from harness import report

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=1)
p.add_argument("--optimizer", default="adamw")
p.add_argument("--steps", type=int, default=8)
p.add_argument("--corrupt", type=int, default=-1, help="world rank whose replica of --corrupt-shard goes bad")
p.add_argument("--corrupt-shard", type=int, default=-1)
p.add_argument("--corrupt-at", type=int, default=-1, help="committed step after which the replica goes bad")
args = p.parse_args()

torch.manual_seed(0)
comm = ftcomm.Communicator()
# 2,410 parameters: not a multiple of 4 or 3, so shards are padded and re-shard pieces straddle.
model = torch.nn.Sequential(torch.nn.Linear(16, 50), torch.nn.Tanh(), torch.nn.Linear(50, 30),
                            torch.nn.Tanh(), torch.nn.Linear(30, 10))
opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer=args.optimizer, lr=0.01,
                              replicas=args.replicas)
gen = torch.Generator().manual_seed(1)
X, Y = torch.randn(96, 16, generator=gen), torch.randint(0, 10, (96,), generator=gen)


def grads(step, rank, size):
    idx = np.array_split(np.arange(96), size)[rank]
    loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx], reduction="sum") / 96
    opt.zero_grad()
    loss.backward()
    return loss.item()


def snapshot():
    state = opt.gather_state()
    return state, opt.flat[: opt.numel].copy()


snap, snap_flat = snapshot()
snap_step, recoveries = 0, 0
while opt.step_id < args.steps:
    step = opt.step_id + 1
    try:
        fault.point("train_step", opt.comm.world_rank, step)
        loss = grads(step, opt.comm.rank, opt.comm.size)
        opt.step(stats=[loss])
        snap, snap_flat = snapshot()
        snap_step = opt.step_id
        if args.corrupt == opt.comm.world_rank and opt.step_id == args.corrupt_at:
            opt.store.get(args.corrupt_shard).state.reshape(-1)[7] += 1.0  # a silent bit flip
    except ftcomm.FtError:
        comm = opt.comm
        while True:
            comm = comm.recover()
            try:
                info = opt.rebuild(comm)
                break
            except ftcomm.StateLostError as lost:
                report(event="state_lost", lost_shards=lost.lost_shards, step=lost.step, size=comm.size)
                raise SystemExit(0)
            except ftcomm.FtError:
                continue
        recoveries += 1
        rebuilt, flat = snapshot()
        report(event="rebuilt", step=opt.step_id, snap_step=snap_step, size=opt.comm.size,
               equal={k: bool(np.array_equal(rebuilt[k], snap[k])) for k in snap},
               params_equal=bool(np.array_equal(flat, snap_flat)),
               from_replica=info["from_replica"], sources={str(k): v for k, v in info["sources"].items()},
               bytes_moved=info["bytes_moved"])

final, _ = snapshot()
report(event="done", step=opt.step_id, size=opt.comm.size, recoveries=recoveries,
       param_crc=int(ftcomm.training.replica.checksum(final["param"])))
