"""Job: DDP on the toy data set (dropout in the model, so the RNG matters) in a ``resilient`` loop
with disk checkpoints; ZeRO's AdamW (``--optimizer zero``) or torch's AdamW on every rank
(``--optimizer ddp``); an LR scheduler as extra state.

    --checkpoint-dir D --every N    checkpoints (resumes from the newest one in D); N may be "auto"
    --log DIR                       the loop's event log (checkpoint events among them)
    --kill-node NODE@STEP           on the first launch (FTCOMM_RESTART=0) the ranks of NODE crash it
                                    at the start of step STEP (their PRRTE daemon and themselves are
                                    SIGKILLed): the whole job ends
    --kill-record DIR               with --kill-node: each crashing rank also writes its "kill" report
                                    to DIR/rank{R}.json (the report line can die with the daemon)
    --stop-at S                     ends after applied step S as if killed there: no last checkpoint
                                    beyond the schedule's (S a multiple of N: its checkpoint on disk)
    --final-checkpoint              with --stop-at: write a checkpoint of step S at the end even if
                                    the schedule did not (as a run that ends there does)
    --sync-writes                   each step first waits until this rank's part of the write in
                                    flight is on disk, and rank 0 until it has published the last
                                    complete one: a fault point of the writer is then reached at a
                                    known step, whatever the machine's load
Kills come from FTCOMM_FAULT (points checkpoint_stage, checkpoint_write, checkpoint_publish,
checkpoint_rename, or any other).

Reports: "used" (step, epoch, this rank's sample ids, world size, a hash of the RNG state the
step started from) per applied step; "state" (step, hash of the parameters and the whole
optimizer state) after every N-th applied step; "resumed" (step, the same hash, before any
training); "done" (steps, hash, world size, the parameters).
"""
import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from harness import ddp_toy_data, report

p = argparse.ArgumentParser(allow_abbrev=False)
p.add_argument("--optimizer", choices=("zero", "ddp"), default="zero")
p.add_argument("--checkpoint-dir")
p.add_argument("--every", default="4")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--stop-at", type=int)
p.add_argument("--sync-writes", action="store_true")
p.add_argument("--final-checkpoint", action="store_true")
p.add_argument("--samples", type=int, default=480)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--drop-last", action="store_true", help="the DataLoader drops each rank's last partial batch")
p.add_argument("--log", help="the loop's event log goes here (rank{rank}.jsonl)")
p.add_argument("--kill-node", help="NODE@STEP: on the first launch, at the start of step STEP, the node's daemon "
                                   "and ranks are SIGKILLed (a node crash; under --fake-nodes)")
p.add_argument("--kill-record", help="DIR: the crashing ranks write their kill report to DIR/rank{R}.json")
args = p.parse_args()

dist.init_process_group("ftcomm")
_, _, sampler, loader = ddp_toy_data(args.samples, args.batch, args.drop_last)
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
ddp = DDP(model)
if args.optimizer == "zero":
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-2)
else:
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
every = args.every if args.every == "auto" else int(args.every)
loop = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt, extra_state=[scheduler],
                              checkpoint_dir=args.checkpoint_dir, checkpoint_every=every,
                              log_path=args.log and f"{args.log}/rank{{rank}}.jsonl")


crash_at = int(args.kill_node.split("@")[1]) if args.kill_node else None


def crash_node(step: int) -> None:
    """On the first launch, the ranks of the node crash (ftcomm.fault.crash_node: their daemon and
    themselves); the other ranks wait for the runtime to end the job (they would otherwise
    recover in the job and train on, as far as they get before it does)."""
    if ftcomm.settings.restart_count():
        return
    if ftcomm.settings.node_name_override() != args.kill_node.split("@")[0]:
        time.sleep(600)
    record = dict(event="kill", step=step, world_size=dist.get_world_size())
    report(**record)
    if args.kill_record:  # on a loaded machine the daemon may die before it forwards that line
        Path(args.kill_record).mkdir(parents=True, exist_ok=True)
        (Path(args.kill_record) / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    time.sleep(1.0)  # the daemon forwards that line before it dies (most often)
    ftcomm.fault.crash_node()


def state_hash() -> str:
    """The parameters and the whole optimizer state (collective with ZeRO: a gather)."""
    h = hashlib.sha256()
    for param in model.parameters():
        h.update(param.detach().numpy().tobytes())
    if args.optimizer == "zero":
        full = opt.sharded.gather_state()
        for name in sorted(full):
            h.update(full[name].tobytes())
        h.update(repr(opt.sharded.scalars).encode())
    else:
        for index, entry in sorted(opt.state_dict()["state"].items()):
            for name, value in sorted(entry.items()):
                h.update(value.numpy().tobytes() if torch.is_tensor(value) else repr(value).encode())
    h.update(repr(scheduler.state_dict()).encode())
    return h.hexdigest()


def stopped() -> bool:
    return args.stop_at is not None and loop.steps_applied >= args.stop_at


first = True
for epoch in loop.epochs(args.epochs):
    for x, y, ids in loop:
        if stopped():  # the loop has applied step --stop-at and started its checkpoint
            break
        if first and loop.resumed_from is not None:
            report(event="resumed", step=loop.resumed_from, hash=state_hash(), size=dist.get_world_size(),
                   rng=hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest())
        first = False
        if args.sync_writes:
            writer = loop._checkpoints.writer  # the loop's writer: this job pins its timing down
            writer.wait_written()
            writer.wait_published()
        if crash_at is not None and loop.steps_applied + 1 == crash_at:
            crash_node(loop.steps_applied + 1)
        rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]  # what dropout draws from
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if loop.step_skipped:
            continue
        scheduler.step()
        step = loop.steps_applied + 1  # the loop counts this step when the body returns
        report(event="used", step=step, epoch=epoch, ids=ids.tolist(), size=dist.get_world_size(), rng=rng)
        if isinstance(every, int) and step % every == 0:
            report(event="state", step=step, hash=state_hash())
    if stopped():
        break
loop.flush_checkpoints(final=args.stop_at is None or args.final_checkpoint)  # completes the write in flight
report(event="done", steps=loop.steps_applied, hash=state_hash(), size=dist.get_world_size(),
       params=torch.cat([q.detach().reshape(-1) for q in model.parameters()]).tolist())
dist.destroy_process_group()
