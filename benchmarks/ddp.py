"""DDP step time on the ftcomm backend against gloo, in the same job.

Each job holds two process groups over the same ranks, ftcomm (the default group) and gloo (a
second group over the same TCP store: 127.0.0.1 and a port agreed through an MPI broadcast, see
ftcomm/torch/group/rendezvous.py), and two identical DDP replicas of one MLP, one per group. Rounds
alternate which backend goes first; each round times ``--steps`` full training steps (forward,
backward with DDP's gradient allreduce, AdamW) per backend. Reported: median step time per
backend and the ratio ftcomm / gloo (below 1.0 = ftcomm faster). A "compute" replica, the same
model without DDP (no communication at all), runs in the same rounds: its step time is the floor
any backend's could reach on this machine, and ``floor`` = compute / gloo is the lowest ratio
ftcomm / gloo possible. ``--grad-outliers`` adds a
third replica on the ftcomm group with the gradient outlier check's comm hook (each rank's bucket
norm sent along with the bucket, ``ftcomm/torch/checks/grad_outliers.py``) and reports its cost against
plain ftcomm, measured in the same rounds. ``--checksums`` likewise adds a replica whose steps
run with the allreduce's transit guard on (FTCOMM_CHECKSUMS set around its steps on every rank)
and reports the guard's cost. Every replica's steps run inside ``ftcomm.torch.resilient(...)``, as
a user's would, so ftcomm's gradient buckets commit once per training step (ftcomm/torch/group/step_commit.py);
``--per-bucket`` adds a replica whose buckets each commit on their own (FTCOMM_STEP_COMMIT=0
around its steps on every rank) and reports what the step-level commit saves against it.
``--gloo-plane`` adds a replica on a second ftcomm group whose buckets go through an inner gloo
group (FTCOMM_DATA_PLANE=gloo when it is made, ftcomm/torch/group/gloo_plane.py) under ftcomm's
control plane (one agreement per step): against plain gloo, that is the control plane's whole cost.
``--fingerprints`` (with ``--gloo-plane``) adds a replica on that group whose steps run with the
result fingerprints on (FTCOMM_FINGERPRINTS set around its steps; ftcomm/torch/group/step_fingerprints.py)
and reports their cost against the gloo plane without them.

    python benchmarks/ddp.py                      # 2 and 4 ranks, prints a table, writes results/
    python benchmarks/ddp.py --ranks 2 --hidden 2048 --rounds 10
    python benchmarks/ddp.py --grad-outliers      # also the outlier check's cost
    python benchmarks/ddp.py --per-bucket         # also one commit per bucket (the step commit's gain)
    python benchmarks/ddp.py --checksums --hidden 2048 --layers 3   # the transit guard's cost, 10M parameters
    python benchmarks/ddp.py --gloo-plane         # gloo as the data plane under ftcomm's control plane
    python benchmarks/ddp.py --gloo-plane --fingerprints   # and the result fingerprints' cost on it

Writes results/ddp-<time>.json (the directory is git-ignored).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP step time, ftcomm vs gloo, same job.")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes to run (default 2 4)")
    p.add_argument("--hidden", type=int, default=1024, help="MLP hidden width (default 1024)")
    p.add_argument("--layers", type=int, default=3, help="hidden layers (default 3)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per backend per round (default 10)")
    p.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per backend first (default 3)")
    p.add_argument("--timeout", type=float, default=600, help="per-job timeout in seconds (default 600)")
    p.add_argument("--grad-outliers", action="store_true", help="also time ftcomm with the gradient outlier check")
    p.add_argument("--checksums", action="store_true", help="also time ftcomm with the allreduce's transit guard")
    p.add_argument("--per-bucket", action="store_true", help="also time ftcomm with one commit per bucket")
    p.add_argument("--gloo-plane", action="store_true", help="also time ftcomm with gloo as its data plane")
    p.add_argument("--fingerprints", action="store_true",
                   help="with --gloo-plane: also time the gloo plane with the result fingerprints on")
    p.add_argument("--out", help="JSON output path (default results/ddp-<time>.json)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # inside the MPI job: write results here
    args = p.parse_args(argv)
    if args.fingerprints and not args.gloo_plane:
        p.error("--fingerprints times the gloo plane with the fingerprints on: add --gloo-plane")
    return args


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch.utils.data import DataLoader, TensorDataset

    from ftcomm.torch import resilient

    torch.set_num_threads(1)
    dist.init_process_group("ftcomm")
    groups = {"ftcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rank, size = dist.get_rank(), dist.get_world_size()

    def make_model():
        torch.manual_seed(0)
        layers, width_in = [], 256
        for _ in range(args.layers):
            layers += [nn.Linear(width_in, args.hidden), nn.ReLU()]
            width_in = args.hidden
        layers.append(nn.Linear(width_in, 10))
        return nn.Sequential(*layers)

    if args.grad_outliers:
        groups["ftcomm+norms"] = groups["ftcomm"]
    if args.checksums:
        groups["ftcomm+checksums"] = groups["ftcomm"]
    if args.per_bucket:
        groups["ftcomm-per-bucket"] = groups["ftcomm"]
    if args.gloo_plane:  # a group's data plane is chosen when it is made
        os.environ["FTCOMM_DATA_PLANE"] = "gloo"
        groups["ftcomm/gloo-plane"] = dist.new_group(backend="ftcomm")
        os.environ["FTCOMM_DATA_PLANE"] = "ring"
        if args.fingerprints:
            groups["ftcomm/gloo-plane+fingerprints"] = groups["ftcomm/gloo-plane"]
    replicas = {}
    for name, group in groups.items():
        model = DDP(make_model(), process_group=group)
        replicas[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    local = make_model()  # the compute floor: forward, backward and AdamW with no allreduce
    replicas["compute"] = (local, torch.optim.AdamW(local.parameters(), lr=1e-3))
    lanes = [*groups, "compute"]
    if args.grad_outliers:
        from ftcomm.torch.checks.grad_outliers import GradOutlierCheck, ddp_hook
        from ftcomm.torch.group.process_group import ftcomm_group

        replicas["ftcomm+norms"][0].register_comm_hook(
            None, ddp_hook(GradOutlierCheck("log"), ftcomm_group(groups["ftcomm"], "benchmark")))
    n_params = sum(p.numel() for p in replicas["ftcomm"][0].parameters())
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 256, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)

    def run(name, steps):
        model, opt = replicas[name]
        group = groups.get(name, groups["ftcomm"])
        group.barrier().wait()
        # the settings are read at each allreduce; every rank sets them for the same replica's steps
        os.environ["FTCOMM_CHECKSUMS"] = "1" if name == "ftcomm+checksums" else "0"
        os.environ["FTCOMM_STEP_COMMIT"] = "0" if name == "ftcomm-per-bucket" else "1"
        os.environ["FTCOMM_FINGERPRINTS"] = "1" if name == "ftcomm/gloo-plane+fingerprints" else "0"
        batches = DataLoader(TensorDataset(x.expand(steps, *x.shape), y.expand(steps, *y.shape)), batch_size=None)
        t0 = time.perf_counter()
        for xb, yb in (batches if name == "compute" else resilient(batches)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        elapsed = (time.perf_counter() - t0) / steps
        group.barrier().wait()  # every bucket's allreduce done before the setting changes
        return elapsed

    for name in lanes:
        run(name, args.warmup)
    times = {name: [] for name in lanes}
    for r in range(args.rounds):
        order = lanes if r % 2 == 0 else list(reversed(lanes))
        for name in order:
            times[name].append(run(name, args.steps))
    # the slowest rank's time is the step time
    t = torch.tensor([times[name] for name in lanes], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
    if rank == 0:
        result = {"ranks": size, "params": n_params, "grad_mib": n_params * 4 / 2**20,
                  "batch": args.batch, "steps": args.steps, "rounds": args.rounds}
        for i, name in enumerate(lanes):
            result[f"{name}_s"] = t[i].tolist()
            result[f"{name}_median_s"] = statistics.median(result[f"{name}_s"])
        result["ratio"] = result["ftcomm_median_s"] / result["gloo_median_s"]
        result["floor_ratio"] = result["compute_median_s"] / result["gloo_median_s"]
        if args.grad_outliers:
            # per round, so that both see the same load: the median of the per-round ratios
            result["norms_cost"] = statistics.median(a / b for a, b in zip(result["ftcomm+norms_s"], result["ftcomm_s"])) - 1
        if args.checksums:
            result["checksums_cost"] = statistics.median(
                a / b for a, b in zip(result["ftcomm+checksums_s"], result["ftcomm_s"])) - 1
        if args.gloo_plane:  # per round, as above: the control plane's cost over plain gloo
            result["gloo_plane_cost"] = statistics.median(
                a / b for a, b in zip(result["ftcomm/gloo-plane_s"], result["gloo_s"])) - 1
        if args.fingerprints:
            result["fingerprints_cost"] = statistics.median(
                a / b for a, b in zip(result["ftcomm/gloo-plane+fingerprints_s"], result["ftcomm/gloo-plane_s"])) - 1
        if args.per_bucket:
            result["per_bucket_ratio"] = result["ftcomm-per-bucket_median_s"] / result["gloo_median_s"]
            result["step_commit_gain"] = 1 - statistics.median(
                a / b for a, b in zip(result["ftcomm_s"], result["ftcomm-per-bucket_s"]))
        Path(args.worker).write_text(json.dumps(result))
    # Orderly teardown: replicas (and their reducers) first, then both groups, all ranks together.
    del replicas, model
    groups["ftcomm"].barrier().wait()
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = []
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(n), "--timeout", str(args.timeout),
                   sys.executable, str(Path(__file__).resolve()), "--worker", str(out),
                   "--hidden", str(args.hidden), "--layers", str(args.layers), "--batch", str(args.batch),
                   "--steps", str(args.steps), "--rounds", str(args.rounds), "--warmup", str(args.warmup)] + \
                (["--grad-outliers"] if args.grad_outliers else []) + (["--checksums"] if args.checksums else []) + \
                (["--per-bucket"] if args.per_bucket else []) + (["--gloo-plane"] if args.gloo_plane else []) + \
                (["--fingerprints"] if args.fingerprints else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
            if proc.returncode != 0 or not out.exists():
                print(f"job with {n} ranks failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            rows.append(json.loads(out.read_text()))
    print(f"{'ranks':>5} {'params':>9} {'grad MiB':>8} {'ftcomm ms':>10} {'gloo ms':>9} {'ratio':>6}"
          f" {'compute ms':>10} {'floor':>6}"
          + (f" {'+norms ms':>10} {'cost':>6}" if args.grad_outliers else "")
          + (f" {'+checksums ms':>13} {'cost':>6}" if args.checksums else "")
          + (f" {'per-bucket ms':>13} {'ratio':>6} {'gain':>6}" if args.per_bucket else "")
          + (f" {'gloo plane ms':>13} {'vs gloo':>7}" if args.gloo_plane else "")
          + (f" {'+fingerprints ms':>16} {'cost':>6}" if args.fingerprints else ""))
    for r in rows:
        print(f"{r['ranks']:>5} {r['params']:>9} {r['grad_mib']:>8.1f} {r['ftcomm_median_s'] * 1e3:>10.2f} "
              f"{r['gloo_median_s'] * 1e3:>9.2f} {r['ratio']:>5.2f}x"
              f" {r['compute_median_s'] * 1e3:>10.2f} {r['floor_ratio']:>5.2f}x"
              + (f" {r['ftcomm+norms_median_s'] * 1e3:>10.2f} {r['norms_cost']:>+6.1%}" if args.grad_outliers else "")
              + (f" {r['ftcomm+checksums_median_s'] * 1e3:>13.2f} {r['checksums_cost']:>+6.1%}" if args.checksums else "")
              + (f" {r['ftcomm-per-bucket_median_s'] * 1e3:>13.2f} {r['per_bucket_ratio']:>5.2f}x"
                 f" {r['step_commit_gain']:>+6.1%}" if args.per_bucket else "")
              + (f" {r['ftcomm/gloo-plane_median_s'] * 1e3:>13.2f} {r['gloo_plane_cost']:>+7.1%}" if args.gloo_plane else "")
              + (f" {r['ftcomm/gloo-plane+fingerprints_median_s'] * 1e3:>16.2f} {r['fingerprints_cost']:>+6.1%}"
                 if args.fingerprints else ""))
    path = Path(args.out) if args.out else REPO / "results" / f"ddp-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host_cpus": os.cpu_count(), "torch_threads": 1, "runs": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
