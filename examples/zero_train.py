"""A stock DDP + ZeRO training script (MLP + AdamW on scikit-learn's digits, DataLoader with
DistributedSampler) whose sharded optimizer state survives rank failures, in memory.

Against the same script on gloo with torch.distributed.optim.ZeroRedundancyOptimizer it differs in
the lines marked `# ftcomm`: the import, the backend name, the optimizer class, the loader
wrapped with the model, optimizer and scheduler, and the epoch loop. Everything under "demo only"
exists to kill a rank on purpose.

    ftcomm-run -n 4 python examples/zero_train.py
    ftcomm-run -n 4 python examples/zero_train.py --kill 2@30             # world rank 2 dies in step 30
    ftcomm-run -n 4 --spares 1 python examples/zero_train.py --kill 2@30  # a spare takes its place
    FTCOMM_DATA_PLANE=nccl ftcomm-run -n 2 python examples/zero_train.py --device cuda --kill 1@30  # 2+ GPUs
    # a node crash ends the whole job; ftcomm-run relaunches it on n1, which resumes from ckpt/
    ftcomm-run --hostfile hosts --fake-nodes --ranks-per-node 2 -n 4 --restarts 2 \
        python examples/zero_train.py --checkpoint-dir ckpt --crash-node n2@30

Each rank keeps the AdamW state of a quarter of the parameters, plus a replica of its ring
predecessor's quarter (--replicas 1). Killed in the middle of its shard update, rank 2's quarter
is rebuilt from its buddy's replica: without spares the survivors re-shard over 3 ranks; with one
the spare takes rank 2's place and receives that quarter only. No disk either way.

Prints one line per epoch and, on rank 0, `test accuracy: A` at the end; --result-json writes
the final numbers (rank 0); the event logs go to --log-dir (default results/zero_train), one run
per ftcomm-run, relaunches included: `ftcomm-report results/zero_train` draws it.
"""
import json
import os
import sys
import time

from cli import Parser, add_device_argument, every, kill_spec, training_device  # examples/cli.py


def parse_args():
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--replicas", type=int, default=1, help="buddies keeping a copy of each shard")
    add_device_argument(parser, "the shard's optimizer state is then kept and updated there, and with "
                                "FTCOMM_DATA_PLANE=nccl the gradient buckets and the parameter allgather "
                                "stay in device memory")
    parser.add_argument("--kill", type=kill_spec, metavar="RANK@STEP",
                        help="demo only: SIGKILL world rank RANK in the shard update of step STEP (steps are "
                             "counted from 1 over the whole run, as the logs and ftcomm-report count them)")
    parser.add_argument("--crash-node", metavar="NODE@STEP",
                        help="demo only, with ftcomm-run --fake-nodes: on the first launch, NODE crashes at the "
                             "start of step STEP (its Open MPI daemon and ranks are SIGKILLed), which ends "
                             "the whole job; with --restarts and --checkpoint-dir it is relaunched and resumes")
    parser.add_argument("--checkpoint-dir", help="asynchronous disk checkpoints here (torch.distributed.checkpoint "
                                                 "format); a run that finds one there resumes from it")
    parser.add_argument("--checkpoint-every", default="10", metavar="N|auto",
                        help='steps between checkpoints (default 10), or "auto" (Young/Daly for FTCOMM_MTBF)')
    parser.add_argument("--result-json", help="write the final numbers here (rank 0)")
    parser.add_argument("--log-dir", default="results/zero_train",
                        help="JSON-lines event logs go here (RUNID.rankN.jsonl; ftcomm-report LOG_DIR draws them)")
    return parser.parse_args()


# Parsed before torch and MPI load, so that a typo fails at once and is said once (cli.py).
ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import ftcomm.torch  # noqa: E402 (ftcomm)
from ftcomm.torch import ZeroRedundancyOptimizer  # noqa: E402 (ftcomm; was torch.distributed.optim's)


def main():
    args = ARGS

    device = training_device(args.device, "zero_train.py")
    dist.init_process_group("ftcomm")  # ftcomm (was "gloo")
    rank = dist.get_rank()
    if args.kill and not ftcomm.fault.can_recover("--kill"):
        sys.exit(2)  # a kill would end this job, or name a rank it does not have

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    train_set = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    ddp_model = DDP(model)
    optimizer = ZeroRedundancyOptimizer(ddp_model.parameters(), torch.optim.AdamW, lr=args.lr,
                                        weight_decay=1e-4, replicas=args.replicas)  # ftcomm: replicas
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()

    # ftcomm: the scheduler goes in extra_state, so that a promoted spare steps it in time
    # ftcomm: with --checkpoint-dir, a disk tier too (the job survives its own end: ftcomm-run --restarts)
    run_id = ftcomm.settings.job_id() or "run"  # one per ftcomm-run, the same in its relaunches
    loader = ftcomm.torch.resilient(loader, model=ddp_model, optimizer=optimizer, extra_state=[scheduler],
                                    log_path=os.path.join(args.log_dir, f"{run_id}.rank{{rank}}.jsonl"),
                                    checkpoint_dir=args.checkpoint_dir, checkpoint_every=every(args.checkpoint_every))
    start = time.perf_counter()
    for epoch in loader.epochs(args.epochs):  # ftcomm (was: for epoch in range(...): sampler.set_epoch(epoch))
        ddp_model.train()
        total, count = 0.0, 0
        for xb, yb in loader:
            step = loader.steps_applied + 1  # the step this iteration runs, from 1 (a redo runs it again)
            if args.kill and args.kill[1] == step:  # demo only
                arm_kill(args.kill[0], loader, optimizer)
            if args.crash_node and args.crash_node.endswith(f"@{step}"):  # demo only
                crash_node(args.crash_node.split("@")[0], loader, step)
            optimizer.zero_grad()
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(ddp_model(xb), yb)
            loss.backward()
            optimizer.step()
            if not loader.step_skipped:  # ftcomm: a voided step is redone, the schedule waits for it
                scheduler.step()
            total += loss.item() * len(yb)
            count += len(yb)
        if dist.get_rank() == 0 and count:  # count 0: resumed from the epoch's last step
            print(f"epoch {epoch:2d}  world size {dist.get_world_size()}  train loss {total / max(count, 1):.4f}  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)

    ddp_model.eval()
    with torch.no_grad():
        accuracy = (model(x_test.to(device)).argmax(1).cpu() == y_test).float().mean().item()
    if dist.get_rank() == 0:
        print(f"test accuracy: {accuracy:.4f}", flush=True)
        if args.result_json:
            with open(args.result_json, "w") as f:
                json.dump({"accuracy": accuracy, "world_size": dist.get_world_size(),
                           "steps": loader.steps_applied, "redone_steps": loader.steps_redone, "joined": loader.joined,
                           "seconds": time.perf_counter() - start, "first_rank": rank,
                           "device": str(device), "data_plane": dist.group.WORLD.data_plane.name,
                           "shard_on_device": optimizer.sharded.device is not None,
                           "shard_bytes": optimizer.sharded.shard_bytes,
                           "replica_bytes": optimizer.sharded.store.nbytes,
                           "rebuild": optimizer.last_rebuild and {k: v for k, v in optimizer.last_rebuild.items()
                                                                  if k != "sources"},
                           "recoveries": [e.as_dict() for e in ftcomm.torch.recoveries()]}, f)
    dist.destroy_process_group()


def crash_node(node, loader, step):
    """Demo only: on the first launch (FTCOMM_RESTART=0), the ranks of ``node`` crash it; the
    others wait for Open MPI to end the job, as it does within moments of a daemon's loss."""
    if ftcomm.settings.restart_count():
        return
    here = ftcomm.settings.node_name_override()
    world_rank = dist.group.WORLD.comm.world_rank
    if here == node:
        print(f"world rank {world_rank}: node {node} crashes", flush=True)
        time.sleep(1.0)  # let the line reach the launcher before the daemon goes
        loader.record(event="kill", step=step)  # for ftcomm-report: when this rank died
        ftcomm.fault.crash_node()
    print(f"world rank {world_rank} (node {here}): waits for the job to end with node {node}", flush=True)
    time.sleep(600)


def arm_kill(world_rank, loader, optimizer):
    """Demo only: world rank ``world_rank`` SIGKILLs itself in the next shard update (and logs it
    first, so that the recovery report times the failure from the kill)."""
    if dist.group.WORLD.comm.world_rank == world_rank:
        loader.record(event="kill", step=optimizer.sharded.step_id + 1)
    ftcomm.fault.inject("shard_update", rank=world_rank, step=optimizer.sharded.step_id + 1)


if __name__ == "__main__":
    main()
