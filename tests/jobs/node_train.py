"""Job: digits training (sharded AdamW, buddy replicas, elastic driver) on simulated nodes, with
the loss of a whole node or of one process at a given step.

    --kill-node n2@40          every rank of node n2 is SIGKILLed at step 40 (its daemon lives)
    --kill-node n2@40 --with-daemon   the node's PRRTE daemon is SIGKILLed too (a node crash)
    --kill-rank 2@40           one process only (the baseline)

The lowest world rank of the node does the killing at the start of step STEP: it reports the
kill time, SIGKILLs its node peers (and their daemon), then itself.
Reports: "placement" (node map and buddies, rank 0), "kill", "commit" (rank 0, first commit
after each recovery), "recovered", "done" (accuracy, steps, size).
"""
import argparse
import os
import signal
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ftcomm
from ftcomm import elastic
from ftcomm.membership import nodes
from ftcomm.training.buddies import buddies
from harness import cross_entropy_backward, report

p = argparse.ArgumentParser()
p.add_argument("--kill-node", help="NODE@STEP")
p.add_argument("--kill-rank", help="RANK@STEP")
p.add_argument("--with-daemon", action="store_true")
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--replicas", type=int, default=1)
args = p.parse_args()

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype(np.float32)
xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)
xtr, ytr, xte, yte = map(torch.from_numpy, (xtr, ytr, xte, yte))
ytr, yte = ytr.long(), yte.long()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
comm = ftcomm.Communicator()
opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer="adamw", lr=5e-3, replicas=args.replicas,
                              weight_decay=1e-4)
node_of = {w: nodes.nodes_of([w])[0] for w in comm.world_ranks} if ftcomm.settings.node_aware() else {}
# pids (and the daemon = parent pid) of every rank, exchanged while nobody has failed
pids = np.zeros((comm.size, 2), np.int64)
pids[comm.rank] = (os.getpid(), os.getppid())
comm.allreduce(pids, op="sum", step=0)  # step 0; the optimizer's training steps start at 1
pid_of = {w: (int(pids[i, 0]), int(pids[i, 1])) for i, w in enumerate(comm.world_ranks)}
if comm.rank == 0:
    lay_nodes = nodes.nodes_of(comm.world_ranks)
    report(event="placement", nodes=node_of,
           buddies={r: buddies(r, comm.size, args.replicas, lay_nodes) for r in range(comm.size)})

victims, kill_step, killer = [], None, None
if args.kill_node:
    name, kill_step = args.kill_node.split("@")
    victims = sorted(w for w, n in node_of.items() if n == name)
elif args.kill_rank:
    r, kill_step = args.kill_rank.split("@")
    victims = [int(r)]
kill_step = None if kill_step is None else int(kill_step)
killer = victims[0] if victims else None
state = elastic.State(model, opt, ftcomm.ElasticSampler(len(xtr), 64, seed=0))
recovering = {"since": None}


def train_step(state, batch):
    if batch.step == kill_step and state.comm.world_rank == killer:
        report(event="kill", time=time.time(), step=batch.step, victims=victims)
        daemons = {pid_of[v][1] for v in victims} if args.with_daemon else set()
        for pid in daemons:  # the node's PRRTE daemon first: a crash takes it at once
            os.kill(pid, signal.SIGKILL)
        for v in victims:
            if v != killer:
                os.kill(pid_of[v][0], signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    return cross_entropy_backward(model, opt, xtr, ytr, batch)


def on_commit(state, step, stats):
    if recovering["since"] is not None and state.comm.rank == 0:
        report(event="commit", step=step, time=time.time(), size=state.comm.size)
        recovering["since"] = None


def on_recover(state, event):
    recovering["since"] = time.time()
    report(**{k: v for k, v in event.items() if k != "rank"})


summary = elastic.run(train_step, state, epochs=args.epochs, progress=False, on_commit=on_commit,
                      on_recover=on_recover)
model.eval()
with torch.no_grad():
    acc = float((model(xte).argmax(1) == yte).float().mean())
report(event="done", steps=summary.steps, failures=summary.failures, size=summary.world_size, accuracy=acc,
       node=node_of.get(state.comm.world_rank))
