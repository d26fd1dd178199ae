"""Fault-matrix job: the elastic driver (ShardedOptimizer, buddy replicas) with ranks
failing at the training layer's points (train_step, shard_update, replicate, shrink, rebuild) with
any kind (FTCOMM_FAULT). After every committed step all ranks gather the full state (snapshot);
after every recovery the rebuilt state is compared bitwise with the snapshot of the last committed
step. Reports: "used" (each committed step), "recovered" (each recovery, with the comparison),
"state_lost", "done". Usage: matrix_train.py [--replicas K] [--steps S] [--checkpoint-dir D]
"""
import argparse
import time

import numpy as np
import torch

import ftcomm
from ftcomm import elastic, fault
from harness import cross_entropy_backward, report

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=1)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--checkpoint-dir")
p.add_argument("--checkpoint-every", type=int, default=0)
args = p.parse_args()

torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
X, Y = torch.randn(96, 16, generator=gen), torch.randint(0, 10, (96,), generator=gen)
# 1,390 parameters: not a multiple of 4 or 3, so shards are padded and re-shard pieces straddle.
model = torch.nn.Sequential(torch.nn.Linear(16, 50), torch.nn.Tanh(), torch.nn.Linear(50, 10))
comm = ftcomm.Communicator()
opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer="adamw", lr=0.01, replicas=args.replicas)
state = elastic.State(model, opt, ftcomm.ElasticSampler(96, 24, seed=5))
snap = {"step": 0, "state": opt.gather_state(), "flat": opt.flat[: opt.numel].copy()}
phase_start = {}


def train_step(state, batch):
    fault.point("train_step", state.comm.world_rank, batch.step)
    phase_start.setdefault(batch.step, time.time())
    return cross_entropy_backward(model, opt, X, Y, batch)


def on_commit(state, step, stats):
    snap.update(step=step, state=opt.gather_state(), flat=opt.flat[: opt.numel].copy())
    report(event="used", step=step, size=state.comm.size, members=state.comm.world_ranks)


def on_recover(state, event):
    rebuilt = opt.gather_state()
    report(event="recovered", step=event["step"], snap_step=snap["step"], size=state.comm.size,
           failed=event["lost_world_ranks"], detection_ms=round(event["detection_s"] * 1e3, 3),
           recovery_ms=round((event["recover_s"] + event["rebuild_s"] + event["agree_s"]) * 1e3, 1),
           disk_restore=event["disk_restore"],
           equal=all(np.array_equal(rebuilt[k], snap["state"][k]) for k in snap["state"]),
           params_equal=bool(np.array_equal(opt.flat[: opt.numel], snap["flat"])))


try:
    summary = elastic.run(train_step, state, steps=args.steps, progress=False, on_commit=on_commit,
                          on_recover=on_recover, checkpoint_dir=args.checkpoint_dir,
                          checkpoint_every=args.checkpoint_every)
except ftcomm.StateLostError as lost:
    report(event="state_lost", lost_shards=lost.lost_shards, step=lost.step, size=opt.comm.size)
    raise SystemExit(0)
final = opt.gather_state()
report(event="done", steps=summary.steps, failures=summary.failures, redone=summary.redone_steps,
       size=summary.world_size, param_crc=int(ftcomm.training.replica.checksum(final["param"])),
       finite=bool(np.isfinite(final["param"]).all()))
