"""MTTR of in-memory buddy replicas against restart from a disk checkpoint, and the per-step cost
of replication, for MLPs of about 1M, 10M and 100M parameters (AdamW, ZeRO-1 shards).

    python benchmarks/mttr.py                       # sizes 1M,10M,100M at 4 ranks
    python benchmarks/mttr.py --sizes 1M,10M --ranks 4 --out results/mttr
    python benchmarks/mttr.py --path torch          # DDP + ftcomm.torch.ZeroRedundancyOptimizer

``--path elastic`` (default) trains with ``ftcomm.ShardedOptimizer`` driven by ``ftcomm.elastic.run``
and checkpoints with ``ftcomm.checkpoint`` (``ftcomm.training.checkpoint``); ``--path torch`` trains a DDP model with
``ftcomm.torch.ZeroRedundancyOptimizer`` in a ``resilient`` loop and checkpoints with
``torch.distributed.checkpoint`` (benchmarks/mttr_torch.py).

For each size, two jobs (each under ftcomm-run with a hard timeout):

* memory: world rank N-1 is SIGKILLed at point ``shard_update`` of step ``--kill-step`` (after the
  gradient allreduce committed, so detection, agreement and shrink are separate phases). MTTR =
  kill (the wall-clock time the killed rank prints to stderr just before SIGKILL) to the first
  committed step after it, split into detection (kill -> exception, wall
  clock, one machine), agree + shrink, state rebuild (find, verify, re-shard, re-replicate) and
  the redone step.
* disk: the same training with replicas=0 and a torch.save checkpoint every ``--ckpt-every``
  steps; the kill aborts the job (the classic way), the benchmark relaunches it with ftcomm-run,
  the ranks load the checkpoint and redo the lost steps. Reported: kill to the first committed
  step after the relaunch, and kill to regaining the step reached before the kill.

With ``--policies shrink,spares,respawn`` the memory job is repeated with each recovery policy:
``spares`` launches one spare (``ftcomm-run --spares 1``) that takes the killed rank's
place, so the world size stays N; ``respawn`` falls back to shrink where MPI_Comm_spawn is
unreliable (Open MPI 5.0.x, docs/SPARES.md), and the result says so.

Replication overhead = replicate phase / whole step (the median over steady steps). Writes
``OUT/mttr.json`` and ``OUT/mttr_timeline.png``; ``ftcomm-goodput --costs OUT/mttr.json`` models
runs at cluster scale from it (docs/GOODPUT.md).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = {"1M": 1_000_000, "10M": 10_000_000, "100M": 100_000_000}


# ------------------------------------------------------------------ worker (inside ftcomm-run)
def hidden_for(params: int, inputs: int = 256) -> int:
    """Width h of Linear(256,h)-ReLU-Linear(h,h)-ReLU-Linear(h,10) with about ``params`` weights."""
    a, b = 1.0, inputs + 10 + 3  # h^2 + (inputs + 10 + 3) h ~ params
    return int((-b + (b * b + 4 * a * params) ** 0.5) / 2)


def make_model(params: int):
    import torch

    h = hidden_for(params)
    return torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                               torch.nn.ReLU(), torch.nn.Linear(h, 10))


def worker(args) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.path == "torch":
        import mttr_torch

        return mttr_torch.worker(args, make_model(args.params))

    import ftcomm
    from ftcomm import checkpoint, elastic, fault

    model = make_model(args.params)
    comm = ftcomm.world()  # a spare waits in here until it is promoted
    disk = args.mode == "disk"
    opt = ftcomm.ShardedOptimizer(model.parameters(), comm, optimizer="adamw", lr=1e-4,
                                  replicas=0 if disk else args.replicas)
    n = 1024
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 256, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    state = elastic.State(model, opt, ftcomm.ElasticSampler(n, args.batch, seed=0))
    log = elastic.EventLog(os.path.join(args.log_dir, "rank{rank}.jsonl"), comm.world_rank, echo=False)
    if disk and args.resume:
        t0 = time.time()
        info = checkpoint.restore_latest(opt, model, comm, args.ckpt_dir)
        state.restore(info["meta"])
        log(event="restored", step=info["step"], load_s=time.time() - t0)
    kill_point = "train_step" if disk else "shard_update"
    if not args.resume:
        fault.inject(kill_point, rank=comm.size - 1, step=args.kill_step)

    def train_step(state, batch):
        fault.point("train_step", state.comm.world_rank, batch.step)
        idx = torch.from_numpy(batch.indices)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum") / batch.global_size
        opt.zero_grad()
        loss.backward()
        return loss.item()

    step_start = [time.perf_counter()]

    def on_commit(state, step, stats):
        now = time.perf_counter()
        log(event="step", step=step, world_size=state.comm.size, step_s=now - step_start[0],
            **{f"{k}_s": v for k, v in opt.timing.items()})
        if disk and step % args.ckpt_every == 0:
            info = checkpoint.save(opt, model, args.ckpt_dir)
            log(event="checkpoint", step=step, seconds=info["seconds"], bytes=info["bytes"])
        step_start[0] = time.perf_counter()

    try:
        summary = elastic.run(train_step, state, steps=args.steps, progress=False, on_commit=on_commit,
                              log_path=os.path.join(args.log_dir, "rank{rank}.jsonl"), policy=args.policy)
    except ftcomm.FtError as err:
        if disk:  # the classic way: a failure ends the job
            log(event="abort", step=opt.step_id, error=type(err).__name__)
            os._exit(3)
        raise
    if comm.world_rank == 0 or state.comm.rank == 0:
        log(event="summary", peak_rss_bytes=summary.peak_rss_bytes, replica_bytes=summary.replica_bytes,
            shard_bytes=opt.shard_bytes, params=opt.numel)


# ------------------------------------------------------------------ driver
def launch(args, size_name, mode, log_dir, extra=(), spares=0):
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(args.ranks), "--timeout", str(args.job_timeout),
           "--spares", str(spares), sys.executable, __file__, "--worker", "--mode", mode, "--params", str(SIZES[size_name]),
           "--steps", str(args.steps), "--kill-step", str(args.kill_step), "--batch", str(args.batch),
           "--replicas", str(args.replicas), "--ckpt-every", str(args.ckpt_every), "--path", args.path,
           "--ckpt-dir", str(Path(log_dir) / "ckpt"), "--log-dir", str(log_dir), *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return proc, time.time() - t0, t0


def read_events(log_dir):
    events = []
    for path in glob.glob(os.path.join(log_dir, "rank*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f if line.strip()]
    return sorted(events, key=lambda e: e["time"])


def steady(events, upto):
    steps = [e for e in events if e["event"] == "step" and e["rank"] == 0 and 2 < e["step"] < upto]
    if not steps:
        return {}
    med = lambda k: statistics.median(e.get(k, 0.0) for e in steps)  # noqa: E731
    out = {k: med(k) for k in ("step_s", "allreduce_s", "update_s", "allgather_s", "replicate_s", "agree_s")}
    out["replication_overhead"] = out["replicate_s"] / out["step_s"] if out["step_s"] else None
    return out


_FAULT_LINE = re.compile(r"ftcomm: fault injection: \w+ rank \d+ at \w+ \(step \d+\), unix time ([0-9.]+)")


def fault_time(stderr: str) -> float:
    """Wall-clock time of the injected fault, from the line the failing rank prints to stderr
    just before it fails (csrc/fault/injection.cpp): MTTR counts from the fault itself."""
    found = _FAULT_LINE.search(stderr)
    if found is None:
        raise RuntimeError(f"no fault injection line in the job's stderr: {stderr[-2000:]}")
    return float(found.group(1))


def memory_result(events, stderr: str):
    kill = {"time": fault_time(stderr)}
    rec = [e for e in events if e["event"] == "recovered"]
    first = next(e for e in events if e["event"] == "first_commit" and e["rank"] == rec[0]["rank"])
    r0 = min(rec, key=lambda e: e["rank"])
    first0 = next(e for e in events if e["event"] == "first_commit" and e["rank"] == r0["rank"])
    detection = max(e["detected_time"] for e in rec) - kill["time"]
    return {"kill_time": kill["time"], "mttr_s": first0["time"] - kill["time"],
            "detection_s": detection, "agree_shrink_s": r0["agree_s"] + r0["recover_s"],
            "rebuild_s": r0["rebuild_s"], "redo_s": first0["time"] - r0["time"],
            "bytes_moved": r0["bytes_moved"], "first_commit_rank0": first["time"]}


def disk_result(before, after, relaunch_started, kill_step, stderr: str):
    kill = {"time": fault_time(stderr)}
    restored = next(e for e in after if e["event"] == "restored" and e["rank"] == 0)
    first = next(e for e in after if e["event"] == "step" and e["rank"] == 0)
    regained = next(e for e in after if e["event"] == "step" and e["rank"] == 0 and e["step"] >= kill_step)
    return {"kill_time": kill["time"], "mttr_s": first["time"] - kill["time"],
            "regain_s": regained["time"] - kill["time"], "relaunch_s": relaunch_started - kill["time"],
            "load_s": restored["load_s"], "checkpoint_step": restored["step"],
            "redone_steps": kill_step - restored["step"],
            "checkpoint_s": statistics.median(e["seconds"] for e in before if e["event"] == "checkpoint"
                                              and e["rank"] == 0)}


def run_policy(args, name, log_dir, policy) -> dict:
    """The memory job with recovery ``policy``: MTTR, its phases, and the world size after it."""
    proc, wall, _ = launch(args, name, "memory", log_dir, extra=("--policy", policy),
                           spares=1 if policy == "spares" else 0)
    events = read_events(log_dir)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    out = memory_result(events, proc.stderr)
    rec = next(e for e in events if e["event"] == "recovered")
    last = max((e for e in events if e["event"] == "step"), key=lambda e: e["step"])
    out.update(job_wall_s=wall, world_size_after=last["world_size"], fallback=rec.get("fallback"),
               policy_used=rec.get("policy"))
    return out


def run_size(args, name):
    base = Path(args.out) / name
    shutil.rmtree(base, ignore_errors=True)
    res = {"size": name, "params_target": SIZES[name]}
    mem_dir = base / "memory"
    proc, wall, _ = launch(args, name, "memory", mem_dir)
    events = read_events(mem_dir)
    if proc.returncode != 0:
        res["memory_error"] = proc.stderr[-2000:]
        return res, events, []
    res["memory"] = memory_result(events, proc.stderr)
    res["steady"] = steady(events, args.kill_step)
    summ = next((e for e in events if e["event"] == "summary"), {})
    res.update({k: summ.get(k) for k in ("params", "peak_rss_bytes", "replica_bytes", "shard_bytes")})
    res["memory"]["job_wall_s"] = wall
    for policy in args.policies.split(","):
        if policy != "shrink":
            res[f"memory_{policy}"] = run_policy(args, name, base / f"memory_{policy}", policy)
    disk_dir = base / "disk"
    proc1, wall1, _ = launch(args, name, "disk", disk_dir)
    before = read_events(disk_dir)
    relaunch = time.time()
    for path in glob.glob(str(disk_dir / "rank*.jsonl")):
        os.rename(path, path + ".first")
    proc2, wall2, _ = launch(args, name, "disk", disk_dir, extra=("--resume",))
    after = read_events(disk_dir)
    if proc2.returncode != 0:
        res["disk_error"] = proc2.stderr[-2000:]
        return res, events, []
    res["disk"] = disk_result(before, after, relaunch, args.kill_step, proc1.stderr)
    res["disk"]["first_job_rc"] = proc1.returncode
    return res, events, before + after


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "memory" in r]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * len(rows) * 2))
    colors = {"detection": "tab:red", "agree+shrink": "tab:orange", "rebuild": "tab:green", "redo step": "tab:blue",
              "abort + job exit": "tab:gray", "relaunch + load + redo": "tab:purple"}
    labels, y = [], 0
    for r in rows:
        m = r["memory"]
        left = 0.0
        for key, val in (("detection", m["detection_s"]), ("agree+shrink", m["agree_shrink_s"]),
                         ("rebuild", m["rebuild_s"]), ("redo step", m["redo_s"])):
            ax.barh(y, val, left=left, color=colors[key], label=key)
            left += val
        labels.append(f"{r['size']} memory")
        y += 1
        if "disk" in r:
            d = r["disk"]
            ax.barh(y, d["relaunch_s"], color=colors["abort + job exit"], label="abort + job exit")
            ax.barh(y, d["regain_s"] - d["relaunch_s"], left=d["relaunch_s"], color=colors["relaunch + load + redo"],
                    label="relaunch + load + redo")
            labels.append(f"{r['size']} disk")
            y += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xscale("log")
    ax.set_xlabel("seconds after the kill (log scale)")
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="lower right")
    ax.set_title("Recovery after one SIGKILL, 4 ranks: in-memory replicas vs disk checkpoint + relaunch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1M,10M,100M", help="comma-separated, from " + ",".join(SIZES))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--kill-step", type=int, default=9)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--path", choices=("elastic", "torch"), default="elastic",
                   help="elastic: ftcomm.ShardedOptimizer + ftcomm.elastic; torch: DDP + "
                        "ftcomm.torch.ZeroRedundancyOptimizer, disk way with torch.distributed.checkpoint")
    p.add_argument("--job-timeout", type=float, default=300)
    p.add_argument("--policies", default="shrink",
                   help="recovery policies to measure, comma-separated from shrink,spares,respawn")
    p.add_argument("--policy", default="shrink", help=argparse.SUPPRESS)  # worker's policy
    p.add_argument("--out", default=str(REPO / "results" / "mttr"))
    # worker mode (the benchmark launches itself under ftcomm-run)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("memory", "disk"), help=argparse.SUPPRESS)
    p.add_argument("--params", type=int, help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    p.add_argument("--log-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.out, exist_ok=True)
    results = []
    for name in args.sizes.split(","):
        if name not in SIZES:
            p.error(f"unknown size {name!r}")
        t0 = time.time()
        res, _, _ = run_size(args, name)
        res["bench_wall_s"] = time.time() - t0
        results.append(res)
        print(json.dumps(res), flush=True)
    out = Path(args.out)
    (out / "mttr.json").write_text(json.dumps({"path": args.path, "ranks": args.ranks, "kill_step": args.kill_step,
                                               "ckpt_every": args.ckpt_every, "results": results}, indent=2))
    plot(results, out / "mttr_timeline.png")
    print(f"wrote {out / 'mttr.json'} and {out / 'mttr_timeline.png'}")


if __name__ == "__main__":
    main()
