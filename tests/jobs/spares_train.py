"""Job: the elastic driver with a recovery policy (shrink, spares or respawn). After
every committed step every rank reports digests of the full committed state (gather_state), of
the parameters, of its RNG state and its data position; after every recovery (on a newcomer:
after it joined) the same digests of the rebuilt state, and the survivors say whether it is
bitwise equal to their snapshot of the last committed step. With --resources, also the RSS and
open file descriptors after each recovery (the leak check). Victims come from FTCOMM_FAULT.

Reports: "commit", "recovered" / "joined", "done", "state_lost". Usage:
spares_train.py --policy P [--steps S] [--replicas K] [--resources]
"""
import argparse
import hashlib
import os

import numpy as np
import torch

import ftcomm
from ftcomm import elastic, fault
from harness import cross_entropy_backward, report

p = argparse.ArgumentParser()
p.add_argument("--policy", default="spares")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--replicas", type=int, default=1)
p.add_argument("--resources", action="store_true")
args = p.parse_args()

comm = ftcomm.world(timeout=30)  # a spare waits in here until it is promoted
torch.manual_seed(comm.world_rank)  # different RNG streams per rank: dropout must match the rank
gen = torch.Generator().manual_seed(1)
X, Y = torch.randn(192, 16, generator=gen), torch.randint(0, 10, (192,), generator=gen)
# 1,390 parameters: not a multiple of 4 or 3, so shards are padded.
model = torch.nn.Sequential(torch.nn.Linear(16, 50), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(50, 10))
try:  # on a newcomer the constructor joins the survivors' rebuild, which may find the state lost
    opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer="adamw", lr=0.01, replicas=args.replicas)
except ftcomm.StateLostError as lost:
    report(event="state_lost", lost_shards=lost.lost_shards, step=lost.step, newcomer=True)
    raise SystemExit(0)
state = elastic.State(model, opt, ftcomm.ElasticSampler(192, 24, seed=5))
snap = {}


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def digests() -> dict:
    full = opt.gather_state()  # collective
    return {"state": digest(*(full[k] for k in sorted(full))), "params": digest(opt.flat[: opt.numel]),
            "rng": digest(torch.get_rng_state().numpy()), "sampler": state.sampler.state_dict()}


def resources() -> dict:
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd"))}


def train_step(state, batch):
    fault.point("train_step", state.comm.world_rank, batch.step)
    return cross_entropy_backward(model, opt, X, Y, batch)


def on_commit(state, step, stats):
    snap.update(digests())
    report(event="commit", step=step, rank=state.comm.rank, size=state.comm.size, **snap)


def on_recover(state, event):
    now = digests()
    equal = {k: now[k] == snap[k] for k in ("state", "params", "rng", "sampler")} if snap else None
    extra = resources() if args.resources else {}
    report(event=event["event"], step=state.step, rank=state.comm.rank, size=state.comm.size,
           promoted=state.comm.promoted, policy=event.get("policy"), fallback=event.get("fallback"),
           equal=equal, **now, **extra)


try:
    summary = elastic.run(train_step, state, steps=args.steps, progress=False, on_commit=on_commit,
                          on_recover=on_recover, policy=args.policy, max_recoveries=64)
except ftcomm.StateLostError as lost:
    report(event="state_lost", lost_shards=lost.lost_shards, step=lost.step, newcomer=False)
    raise SystemExit(0)
report(event="done", steps=summary.steps, failures=summary.failures, size=summary.world_size,
       rank=opt.comm.rank, promoted=opt.comm.promoted, final=digests()["state"])
