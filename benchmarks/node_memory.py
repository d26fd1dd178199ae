"""What keeping the shards in node-local shared memory costs a step, measured in one job.

    python benchmarks/node_memory.py                        # 10M and 100M parameters, 4 ranks
    python benchmarks/node_memory.py --sizes 10M --cycles 5

Each rank builds two ``ShardedOptimizer``s (AdamW, one replica) over two copies of the MLP of
benchmarks/mttr.py: one with its live, staging and replica buffers in ``/dev/shm`` segments
(``FTCOMM_WARM=1``, what ``ftcomm-run`` gives by default), one in private memory
(``FTCOMM_WARM=0``). They take turns, 10 steps each, in a fresh order every cycle, so that both
see the same load. A step is the optimizer's whole step (gradient allreduce, shard update,
allgather, replication, the agreement, and for the shared one its commit marks) on fixed random
gradients. Reported: the median step time of each and their ratio.

Writes ``OUT/node_memory.json`` and prints the README's table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = {"1M": 1_000_000, "10M": 10_000_000, "100M": 100_000_000}
BLOCK = 10
WARMUP = 3


def worker(args) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mttr

    import ftcomm

    torch.manual_seed(0)
    torch.set_num_threads(1)
    comm = ftcomm.Communicator()
    engines = {}
    for kind, flag in (("shared", "1"), ("private", "0")):
        os.environ["FTCOMM_WARM"] = flag  # read when the optimizer is built
        model = mttr.make_model(args.params)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        engines[kind] = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer=torch.optim.AdamW, lr=1e-4,
                                                replicas=1)
    if (engines["shared"].memory is None) == (engines["private"].memory is None):
        raise SystemExit("node memory did not switch: run under ftcomm-run")
    times = {kind: [] for kind in engines}
    order = random.Random(7)
    for cycle in range(args.cycles):
        kinds = sorted(engines)
        order.shuffle(kinds)
        for kind in kinds:
            for k in range(BLOCK + WARMUP):
                comm.barrier()
                t0 = time.perf_counter()
                engines[kind].step()
                if k >= WARMUP:
                    times[kind].append(time.perf_counter() - t0)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"params": args.params, "times": times}), flush=True)


def run_size(args, name: str) -> dict:
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(args.ranks), "--timeout", "1800", sys.executable,
           __file__, "--worker", "--params", str(SIZES[name]), "--cycles", str(args.cycles)]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{name}: job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    times = json.loads(line[len("RESULT "):])["times"]
    out = {kind: {"median_step_s": statistics.median(t), "steps": len(t)} for kind, t in times.items()}
    out["ratio"] = out["shared"]["median_step_s"] / out["private"]["median_step_s"]
    print(f"{name}: {json.dumps(out)}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--params", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="10M,100M", help="comma-separated: 1M, 10M, 100M (default 10M,100M)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--cycles", type=int, default=4, help=f"turns of {BLOCK} steps per kind (default 4)")
    p.add_argument("--out", default="results/node_memory")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    results = {name: run_size(args, name) for name in args.sizes.split(",")}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "node_memory.json").write_text(json.dumps(results, indent=1))
    print("\n| parameters | step, shared memory | step, private memory | ratio |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {1e3 * r['shared']['median_step_s']:.1f} ms | {1e3 * r['private']['median_step_s']:.1f} ms "
              f"| {r['ratio']:.3f} |")


if __name__ == "__main__":
    main()
