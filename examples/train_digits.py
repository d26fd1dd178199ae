"""Data-parallel training of a small MLP on scikit-learn's bundled digits (no download) with
ftcomm's sharded AdamW, buddy replicas and elastic driver; ranks can be killed on purpose.

    ftcomm-run -n 4 --timeout 300 python examples/train_digits.py
    ftcomm-run -n 4 --timeout 300 python examples/train_digits.py --kill 2@60
    ftcomm-run -n 4 --timeout 300 python examples/train_digits.py --kill 1@40 --kill 3@120
    ftcomm-run -n 4 --spares 1 --timeout 300 python examples/train_digits.py --kill 2@60

``--kill RANK@STEP`` arms ftcomm's fault injection (point "train_step"): world rank RANK
SIGKILLs itself at the start of training step STEP. The survivors recover, re-shard and go on
(``--policy shrink``, the default without spares), or an idle spare takes the dead rank's place
and the world size stays 4 (``--policy spares``, the default with ``ftcomm-run --spares S``;
spares have world ranks 4, 5, ...);
at the end rank 0 prints the test accuracy, the recovery timeline and the MTTR (kill to the
first committed step after it), and one JSON summary line (prefix ``SUMMARY``).
``ftcomm-report results/train_digits`` draws the run's timeline and sums up what its failures
cost (docs/GOODPUT.md).
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
import zlib

from cli import Parser  # examples/cli.py


def parse_args():
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--replicas", type=int, default=1, help="buddies per shard (k)")
    p.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                   help="SIGKILL world rank RANK at the start of training step STEP (counted from 1, as the "
                        "logs and ftcomm-report count steps; repeatable)")
    p.add_argument("--policy", choices=("shrink", "spares", "respawn"),
                   help="recovery policy (default: spares when ftcomm-run --spares S gave the job spares, else "
                        "shrink)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default="results/train_digits", help="JSON-lines event logs go here")
    p.add_argument("--checkpoint-dir", help="disk checkpoints (fallback only)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="M")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = p.parse_args()
    try:
        args.kill = [tuple(int(v) for v in k.split("@")) for k in args.kill]
    except ValueError:
        p.error("--kill takes RANK@STEP, e.g. 2@60")
    return args


# Parsed before torch and MPI load, so that a typo fails at once and is said once (cli.py).
ARGS = parse_args() if __name__ == "__main__" else None

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import ftcomm  # noqa: E402
from ftcomm import elastic, fault  # noqa: E402


def load_data(seed: int):
    """Digits 8x8 -> 64 features in [0, 1]; 75/25 stratified split (1347 train, 450 test)."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, stratify=y, random_state=seed)
    return (torch.from_numpy(xtr), torch.from_numpy(ytr).long(),
            torch.from_numpy(xte), torch.from_numpy(yte).long())


def run_id(comm) -> int:
    """The same id on every rank, to keep this run's logs apart: from ftcomm-run's run directory
    (a promoted spare arrives late and must find it without asking), else rank 0's clock."""
    run_dir = os.environ.get("FTCOMM_RUN_DIR")
    if run_dir:
        return zlib.crc32(run_dir.encode())
    value = np.array([int(time.time() * 1000) if comm.rank == 0 else 0], np.int64)
    comm.broadcast(value, 0)
    return int(value[0])


def timeline(log_dir: str, rid: int) -> list[dict]:
    """Every rank's events of this run, sorted by time (one machine or a shared file system)."""
    events = []
    for path in glob.glob(os.path.join(log_dir, f"{rid}.rank*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f if line.strip()]
    return sorted(events, key=lambda e: e["time"])


def _ms(seconds) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def mttr(events: list[dict]) -> list[dict]:
    """For each kill: seconds from the kill to the first committed step after it."""
    out = []
    for kill in (e for e in events if e["event"] == "kill"):
        first = next((e for e in events if e["event"] == "first_commit" and e["time"] > kill["time"]), None)
        rec = next((e for e in events if e["event"] == "recovered" and e["time"] > kill["time"] and e["rank"] == 0),
                   None)
        if first is not None:
            out.append({"killed_rank": kill["rank"], "step": kill["step"],
                        "mttr_s": round(first["time"] - kill["time"], 4),
                        "detection_ms": rec and _ms(rec["detection_s"]), "recover_ms": rec and _ms(rec["recover_s"]),
                        "rebuild_ms": rec and _ms(rec["rebuild_s"]), "bytes_moved": rec and rec["bytes_moved"]})
    return out


def main():
    args = ARGS
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load_data(args.seed)
    comm = ftcomm.world()  # on a spare: returns once it is promoted (or ends the process)
    rid = run_id(comm)
    if args.kill and not fault.can_recover("--kill"):
        sys.exit(2)  # a kill would end this job, or name a rank it does not have
    for rank, step in args.kill:
        fault.inject("train_step", rank=rank, step=step, kind="kill")

    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    hyper = {"weight_decay": 1e-4} if args.optimizer == "adamw" else {"momentum": 0.9}
    opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer=args.optimizer, lr=args.lr,
                                  replicas=args.replicas, **hyper)
    state = elastic.State(model, opt, ftcomm.ElasticSampler(len(xtr), args.batch, seed=args.seed))
    log_path = os.path.join(args.log_dir, f"{rid}.rank{{rank}}.jsonl")
    log = elastic.EventLog(log_path, comm.world_rank, echo=False)
    kills = set(args.kill)

    def train_step(state, batch):
        if (state.comm.world_rank, batch.step) in kills:
            log(event="kill", step=batch.step)  # written and closed before the SIGKILL below
        fault.point("train_step", state.comm.world_rank, batch.step)
        idx = torch.from_numpy(batch.indices)
        loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx], reduction="sum") / batch.global_size
        opt.zero_grad()
        loss.backward()
        return loss.item()

    t0 = time.time()
    summary = elastic.run(train_step, state, epochs=args.epochs, log_path=log_path,
                          progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
                          checkpoint_every=args.checkpoint_every, policy=args.policy)
    wall = time.time() - t0
    model.eval()
    with torch.no_grad():
        accuracy = float((model(xte).argmax(1) == yte).float().mean())
    state.comm.barrier()  # every survivor has written its log
    if state.comm.rank == 0:
        report(args, summary, accuracy, wall, timeline(args.log_dir, rid))


def report(args, summary, accuracy, wall, events) -> None:
    print(f"test accuracy {accuracy:.4f} after {summary.steps} steps, {wall:.1f} s, "
          f"world size {summary.world_size}, {summary.failures} failure(s), {summary.redone_steps} step(s) redone")
    print(f"peak RSS of rank 0: {summary.peak_rss_bytes / 2**20:.1f} MiB, replicas held: {summary.replica_bytes} bytes")
    shown = [e for e in events if e["event"] not in ("start", "commit", "end")]  # ftcomm-report draws those
    if shown:
        print("recovery timeline:")
        start = shown[0]["time"]
        for e in shown:
            detail = {k: round(v, 4) if isinstance(v, float) else v for k, v in e.items()
                      if k not in ("time", "event", "rank", "detected_time", "old_to_new") and v not in (None, [], False)}
            print(f"  +{e['time'] - start:8.4f} s  rank {e['rank']}  {e['event']:<13} {json.dumps(detail)}")
    repairs = mttr(events)
    for r in repairs:
        print(f"MTTR after killing rank {r['killed_rank']} at step {r['step']}: {r['mttr_s'] * 1e3:.1f} ms "
              f"(detection {r['detection_ms']} ms, recover {r['recover_ms']} ms, rebuild {r['rebuild_ms']} ms)")
    print("SUMMARY " + json.dumps({"accuracy": accuracy, "steps": summary.steps, "world_size": summary.world_size,
                                   "failures": summary.failures, "redone_steps": summary.redone_steps,
                                   "mttr": repairs, "wall_s": round(wall, 3),
                                   "peak_rss_bytes": summary.peak_rss_bytes}), flush=True)


if __name__ == "__main__":
    main()
