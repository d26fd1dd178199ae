"""A stock DistributedDataParallel training script (MLP + AdamW on scikit-learn's bundled digits
data set, DataLoader with DistributedSampler) that survives rank failures on ftcomm.

Against the same script on gloo it differs in the lines marked `# ftcomm`: the import that
registers the backend, the backend name, the loader wrapped with the model and optimizer, and the
epoch loop. Everything under "demo only" exists to kill a rank on purpose.

    ftcomm-run -n 4 python examples/ddp_train.py
    ftcomm-run -n 4 python examples/ddp_train.py --kill 2@30     # world rank 2 dies in step 30
    ftcomm-run -n 4 --spares 1 python examples/ddp_train.py --kill 2@30   # a spare takes its place
    FTCOMM_DATA_PLANE=nccl ftcomm-run -n 2 python examples/ddp_train.py --device cuda --kill 1@30  # 2+ GPUs

Without spares the survivors go on at world size 3; with one, the spare (world rank 4) starts
this script inside `import ftcomm.torch`, gets the model, optimizer and data position from the
survivors, and the job ends at world size 4.

Prints one line per epoch and, on rank 0, `test accuracy: A` at the end; --result-json writes
the final numbers (rank 0).
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
    parser.add_argument("--backend", default="ftcomm")  # ftcomm (was "gloo")
    add_device_argument(parser, "the gradient buckets then go through FTCOMM_DATA_PLANE's plane "
                                "(nccl: in device memory)")
    parser.add_argument("--kill", type=kill_spec, metavar="RANK@STEP",
                        help="demo only: SIGKILL world rank RANK inside the gradient allreduce of step "
                             "STEP (steps are counted from 1 over the whole run, as the logs and "
                             "ftcomm-report count them)")
    parser.add_argument("--checkpoint-dir", help="asynchronous disk checkpoints here (torch.distributed.checkpoint "
                                                 "format); a run that finds one there resumes from it")
    parser.add_argument("--checkpoint-every", default="10", metavar="N|auto",
                        help='steps between checkpoints (default 10), or "auto" (Young/Daly for FTCOMM_MTBF)')
    parser.add_argument("--result-json", help="write the final numbers here (rank 0)")
    parser.add_argument("--log-dir", default="results/ddp_train",
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


def main():
    args = ARGS

    device = training_device(args.device, "ddp_train.py")
    dist.init_process_group(args.backend)
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
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    run_id = ftcomm.settings.job_id() or "run"  # one per ftcomm-run, the same in its relaunches
    loader = ftcomm.torch.resilient(loader, model=ddp_model, optimizer=optimizer,  # ftcomm
                                    log_path=os.path.join(args.log_dir, f"{run_id}.rank{{rank}}.jsonl"),
                                    checkpoint_dir=args.checkpoint_dir,  # with a disk tier: ftcomm-run --restarts
                                    checkpoint_every=every(args.checkpoint_every))
    start = time.perf_counter()
    for epoch in loader.epochs(args.epochs):  # ftcomm (was: for epoch in range(...): sampler.set_epoch(epoch))
        ddp_model.train()
        total, count = 0.0, 0
        for xb, yb in loader:
            step = loader.steps_applied + 1  # the step this iteration runs, from 1 (a redo runs it again)
            if args.kill and args.kill[1] == step:  # demo only
                arm_kill(args.kill[0], loader, model)
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(xb), yb)
            loss.backward()
            optimizer.step()
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
                           "recoveries": [e.as_dict() for e in ftcomm.torch.recoveries()]}, f)
    dist.destroy_process_group()


def arm_kill(world_rank, loader, model):
    """Demo only: world rank ``world_rank`` SIGKILLs itself in the next gradient allreduce (and
    logs it first, so that the recovery report times the failure from the kill)."""
    comm = dist.group.WORLD.comm
    step_id = comm.last_committed_step + 1  # the communicator counts its allreduces from 0
    if comm.world_rank == world_rank:
        loader.record(event="kill", step=loader.steps_applied + 1)
        print(f"demo: world rank {world_rank} dies in training step {loader.steps_applied + 1}, in its gradient "
              f"allreduce (the communicator's step id {step_id}, as the fault line below says)", file=sys.stderr,
              flush=True)
    # in the ring's reduce-scatter, or in the inner gloo or NCCL group's allreduce (FTCOMM_DATA_PLANE)
    point = dist.group.WORLD.bucket_fault_point([next(model.parameters())])
    ftcomm.fault.inject(point, rank=world_rank, step=step_id)


if __name__ == "__main__":
    main()
