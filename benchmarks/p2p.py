"""Point-to-point bandwidth on the ftcomm backend against gloo, in the same job.

A 2-rank job holds two process groups over the same ranks, ftcomm (the default group) and gloo (a
second group, ``dist.new_group(backend="gloo")``). For each message size, rounds alternate which
backend goes first; a round times ``--reps`` ping-pongs (rank 0 sends, rank 1 receives and sends
back) per backend. Reported per size: the median one-way time over the rounds, the bandwidth
(bytes / one-way time) and the ratio ftcomm / gloo of the per-round times' median (below 1.0 =
ftcomm faster).

    python benchmarks/p2p.py                           # 1, 4, 16, 64 MiB
    python benchmarks/p2p.py --sizes-mib 1 64 --rounds 10

Writes results/p2p-<time>.json (the directory is git-ignored).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Point-to-point bandwidth, ftcomm vs gloo, same job.")
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64], help="message sizes, MiB")
    p.add_argument("--reps", type=int, default=5, help="ping-pongs per backend per round (default 5)")
    p.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    p.add_argument("--timeout", type=float, default=600, help="job timeout in seconds (default 600)")
    p.add_argument("--out", help="JSON output path (default results/p2p-<time>.json)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # inside the MPI job: write results here
    return p.parse_args(argv)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import ftcomm.torch  # noqa: F401  (registers "ftcomm")

    dist.init_process_group("ftcomm")
    groups = {"ftcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rank = dist.get_rank()

    def ping_pong(group, buf, reps: int) -> float:
        """Seconds per one-way message, over ``reps`` round trips."""
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                dist.send(buf, 1, group=group)
                dist.recv(buf, 1, group=group)
            else:
                dist.recv(buf, 0, group=group)
                dist.send(buf, 0, group=group)
        return (time.perf_counter() - t0) / (2 * reps)

    rows = []
    for mib in args.sizes_mib:
        buf = torch.zeros(mib << 18)  # float32: 2**18 elements per MiB
        for group in groups.values():
            ping_pong(group, buf, 1)  # warm-up: connections, first-touch
        times = {name: [] for name in groups}
        for r in range(args.rounds):
            for name in (list(groups) if r % 2 == 0 else list(reversed(groups))):
                times[name].append(ping_pong(groups[name], buf, args.reps))
        row = {"mib": mib, **{f"{name}_s": t for name, t in times.items()}}
        for name in groups:
            row[f"{name}_median_s"] = statistics.median(times[name])
            row[f"{name}_gbps"] = (mib << 20) / row[f"{name}_median_s"] / 1e9
        row["ratio"] = statistics.median(a / b for a, b in zip(times["ftcomm"], times["gloo"]))
        rows.append(row)
    if rank == 0:
        Path(args.worker).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "ftcomm.launch", "-n", "2", "--timeout", str(args.timeout), sys.executable,
               str(Path(__file__).resolve()), "--worker", str(out), "--reps", str(args.reps),
               "--rounds", str(args.rounds), "--sizes-mib", *map(str, args.sizes_mib)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
        if proc.returncode != 0 or not out.exists():
            print(f"job failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows = json.loads(out.read_text())
    print(f"{'MiB':>4} {'ftcomm ms':>10} {'GB/s':>6} {'gloo ms':>8} {'GB/s':>6} {'ratio':>6}")
    for r in rows:
        print(f"{r['mib']:>4} {r['ftcomm_median_s'] * 1e3:>10.2f} {r['ftcomm_gbps']:>6.2f} "
              f"{r['gloo_median_s'] * 1e3:>8.2f} {r['gloo_gbps']:>6.2f} {r['ratio']:>6.3f}")
    path = Path(args.out) if args.out else REPO / "results" / f"p2p-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
