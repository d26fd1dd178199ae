"""Job: the elastic driver on a synthetic classification set. Every rank reports the sample
indices it used in each committed step ("used"), so the test can account for every sample.
Kills come from FTCOMM_FAULT (point train_step); --checkpoint-dir enables the disk fallback;
--check-every M scrubs the sharded state every M steps (bit flips: points shard, replica).
--crash-node NODE@STEP: on the first launch (FTCOMM_RESTART=0) the ranks of made-up node NODE
crash it at the start of step STEP (their PRRTE daemon and themselves SIGKILLed: the whole job
ends) while the others wait to be ended; --log DIR writes the driver's event log.
Reports: "used" (per committed step), "recovered" (per recovery), "resumed", "state_lost", "done".
"""
import argparse
import hashlib
import time

import torch

import ftcomm
from ftcomm import elastic, fault
from harness import cross_entropy_backward, report

p = argparse.ArgumentParser()
p.add_argument("--replicas", type=int, default=1)
p.add_argument("--samples", type=int, default=300)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--checkpoint-dir")
p.add_argument("--checkpoint-every", type=int, default=0)
p.add_argument("--check-every", type=int, default=0)
p.add_argument("--crash-node")
p.add_argument("--log")
args = p.parse_args()
crash_node, crash_step = args.crash_node.split("@") if args.crash_node else (None, None)

torch.manual_seed(0)
gen = torch.Generator().manual_seed(3)
X = torch.randn(args.samples, 8, generator=gen)
Y = (X[:, 0] > 0).long()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 2))
comm = ftcomm.Communicator()
opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer="sgd", lr=0.1, momentum=0.9,
                              replicas=args.replicas)
state = elastic.State(model, opt, ftcomm.ElasticSampler(args.samples, args.batch, seed=5))
attempted = {}


def train_step(state, batch):
    if crash_node and batch.step == int(crash_step) and not ftcomm.settings.restart_count():
        if ftcomm.settings.node_name_override() == crash_node:
            report(event="crash", step=batch.step, world_rank=state.comm.world_rank)
            time.sleep(0.5)  # the report reaches the launcher first
            fault.crash_node()
        time.sleep(600)  # the other nodes' ranks commit nothing more: Open MPI ends them
    fault.point("train_step", state.comm.world_rank, batch.step)
    attempted[batch.step] = (batch.epoch, batch.indices.tolist())
    return cross_entropy_backward(model, opt, X, Y, batch)


def on_commit(state, step, stats):
    epoch, used = attempted[step]
    report(event="used", step=step, epoch=epoch, indices=used, size=state.comm.size,
           global_count=int(stats[-1]))


def on_recover(state, event):
    report(**{k: v for k, v in event.items() if k != "rank"})


try:
    summary = elastic.run(train_step, state, epochs=args.epochs, progress=False, on_commit=on_commit,
                          on_recover=on_recover, checkpoint_dir=args.checkpoint_dir,
                          checkpoint_every=args.checkpoint_every, check_every=args.check_every,
                          log_path=args.log and f"{args.log}/rank{{rank}}.jsonl")
except ftcomm.StateLostError as lost:
    report(event="state_lost", lost_shards=lost.lost_shards, step=lost.step)
    raise SystemExit(0)
full_state = opt.gather_state()
model.eval()
acc = float((model(X).argmax(1) == Y).float().mean())
report(event="done", steps=summary.steps, failures=summary.failures, redone=summary.redone_steps,
       size=summary.world_size, accuracy=acc, epoch=state.sampler.epoch,
       params=hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest(),
       corruptions=[(e.step, e.ranks, e.action) for e in ftcomm.corruptions()],
       state=hashlib.sha256(b"".join(full_state[k].tobytes() for k in sorted(full_state))).hexdigest())
