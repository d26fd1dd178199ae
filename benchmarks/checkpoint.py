"""What the disk tier costs a training step, how fast it writes, and how long a dead job takes to
train again, all measured in one run.

    python benchmarks/checkpoint.py                            # 10M and 100M parameters, 4 ranks
    python benchmarks/checkpoint.py --sizes 10M --rounds 3 --out results/checkpoint

The job: DDP over the "ftcomm" backend with ``ftcomm.torch.ZeroRedundancyOptimizer`` (AdamW, one
replica) on the MLP of benchmarks/mttr.py, in a ``resilient`` loop. One job per lane and round,
the lanes in a fresh random order each round:

- ``none``: no checkpoint;
- ``async1``, ``async10``: ftcomm's asynchronous checkpoints every step, every 10 steps
  (``resilient(checkpoint_dir=..., checkpoint_every=N)``);
- ``sync10``: every 10 steps each rank ``torch.save``s its share (its slice of the model, its
  optimizer shard) and fsyncs, then a barrier: the step waits for the disk;
- ``dcp10``: every 10 steps torch's own ``torch.distributed.checkpoint.async_save`` of the same
  bytes (each rank its shard under names of its own, over a gloo group), waiting for the previous
  one first, as torch's documentation does.

Step time = from one loop body's start to the next one's (staging, agreements, data, all of it).
Reported per lane: the median and the mean step time, their ratio to ``none``'s, and, for ftcomm's
lanes, the staging stall per checkpoint and its share of the steps between two checkpoints.

Write throughput: after training, in the ``async10`` job, every rank writes its checkpoint part
with the background writer's own code and, alternately, the same bytes with one sequential write
and fsync (all ranks at once, three times each): the ratio is the format's cost on this disk. The
writes that ran beside training are reported too (bytes / seconds of each background write).

Relaunch (``--relaunch``, on by default): 2 made-up nodes x 2 ranks (``ftcomm-run --fake-nodes
--restarts 1``), a checkpoint every 10 steps; at step 25 node n2's daemon is killed, the whole
job ends, ftcomm-run relaunches it on n1 and it resumes from the checkpoint of step 20. Reported:
the job's own start-up (launch, imports, ``init_process_group``) and, from the daemon's death to
the first committed step after the relaunch: launch (the death to the relaunched script's first
line: the old job's end, the backoff, mpirun), imports and ``init_process_group``, load, redo.

Writes ``OUT/checkpoint.json`` and prints the README's tables.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT_START = time.time()  # before the heavy imports, for the start-up figures

REPO = Path(__file__).resolve().parent.parent
SIZES = {"1M": 1_000_000, "10M": 10_000_000, "100M": 100_000_000}
LANES = ("none", "async1", "async10", "sync10", "dcp10")
WARMUP = 3  # steps left out of the step-time figures (first touches, DDP's bucket rebuild)


# ------------------------------------------------------------------ worker (inside ftcomm-run)
class Events:
    """Appends one JSON line per event to ``log_dir/rank{world rank}.jsonl``."""

    def __init__(self, log_dir: str, world_rank: int):
        os.makedirs(log_dir, exist_ok=True)
        self.path, self.world_rank = os.path.join(log_dir, f"rank{world_rank}.jsonl"), world_rank

    def __call__(self, **event) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "rank": self.world_rank, **event}) + "\n")


def _fsync_write(path: str, chunks) -> int:
    """One sequential write of ``chunks`` (tensors' bytes) and an fsync: the disk's own speed."""
    nbytes = 0
    with open(path, "wb") as f:
        for t in chunks:
            view = t.numpy().view("uint8").reshape(-1)
            f.write(memoryview(view))
            nbytes += view.nbytes
        f.flush()
        os.fsync(f.fileno())
    return nbytes


def _sync_save(path: str, entries: dict) -> int:
    """``torch.save`` of this rank's share, fsynced: the classic synchronous checkpoint."""
    import torch

    from ftcomm.training.checkpoint import Blob

    with open(path, "wb") as f:
        torch.save({k: (e.value if isinstance(e, Blob) else e.tensor) for k, e in entries.items()}, f)
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path)


def _throughput(args, log, pg, part: dict) -> None:
    """The background writer's code against one sequential write of the same bytes, alternately,
    every rank at once."""
    from ftcomm.training.checkpoint import Blob, dcp_parts
    from ftcomm.training.checkpoint.staging import StagingBuffers

    staged = StagingBuffers().stage(part)
    tensors = [e.tensor for e in staged.values() if not isinstance(e, Blob)]
    for round_ in range(3):
        for how in ("ftcomm", "plain"):
            target = os.path.join(args.ckpt_dir, f"bench-{how}-{round_}")
            pg.comm.barrier()
            t0 = time.perf_counter()
            if how == "ftcomm":
                nbytes = dcp_parts.write_part(target, pg.comm.rank, staged)
            else:
                os.makedirs(target, exist_ok=True)
                nbytes = _fsync_write(os.path.join(target, f"rank{pg.comm.rank}"), tensors)
            seconds = time.perf_counter() - t0
            pg.comm.barrier()
            log(event="throughput", how=how, bytes=nbytes, seconds=seconds)
            shutil.rmtree(target, ignore_errors=True)


def _kill_node(log, pg, pids: dict, node: str, step: int) -> None:
    """Relaunch lane: the lowest rank of ``node`` SIGKILLs the node's PRRTE daemon (its parent),
    its node peers, and itself: a node crash, which ends the whole job under PRRTE 3."""
    mine = [w for w, (n, _, _) in pids.items() if n == node]
    if pg.comm.world_rank != min(mine):
        return
    log(event="kill", step=step)
    os.kill(os.getppid(), signal.SIGKILL)
    for w in mine:
        if w != pg.comm.world_rank:
            os.kill(pids[w][1], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import ftcomm.torch
    from ftcomm.torch import checkpoint as torch_checkpoint

    imports_done = time.time()
    dist.init_process_group("ftcomm")
    init_done = time.time()
    pg = dist.group.WORLD
    log = Events(args.log_dir, pg.comm.world_rank)
    restart = ftcomm.settings.restart_count()
    log(event="started", script=SCRIPT_START, imports=imports_done, init=init_done, restart=restart,
        size=pg.size())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mttr

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = mttr.make_model(args.params)
    ddp = DDP(model)
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-4, replicas=1)
    gen = torch.Generator().manual_seed(1)
    n = 64 * pg.size() * (args.steps + 5)
    data = TensorDataset(torch.randn(n, 256, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    every = {"async1": 1, "async10": 10, "relaunch": 10}.get(args.lane, 0)
    loop = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt, checkpoint_dir=args.ckpt_dir if every else None,
                                  checkpoint_every=every,
                                  log_path=os.path.join(args.log_dir, "loop.rank{rank}.jsonl"))
    gloo = dist.new_group(backend="gloo") if args.lane == "dcp10" else None
    pids = {}
    if args.lane == "relaunch":  # every rank's node and pid, and its daemon's, while all are alive
        ours = json.dumps([pg.comm.world_rank, ftcomm.settings.node_name_override(), os.getpid()])
        gathered = [None] * pg.size()
        dist.all_gather_object(gathered, ours)
        pids = {w: (node, pid, None) for w, node, pid in map(json.loads, gathered)}
    pending, last = None, None
    os.makedirs(args.ckpt_dir, exist_ok=True)
    for _ in loop.epochs(10**6):
        for x, y in loop:
            now = time.perf_counter()
            if last is not None:
                log(event="step", step=loop.steps_applied, step_s=now - last)
            last = now
            if loop.steps_applied >= args.steps:
                break
            if args.lane == "relaunch" and restart == 0 and loop.steps_applied == args.kill_step:
                _kill_node(log, pg, pids, "n2", loop.steps_applied)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            step = loop.steps_applied + 1
            if loop.step_skipped or step % 10:
                continue
            share = lambda: torch_checkpoint.entries(pg, ddp, opt, [], {"epoch": 0})  # noqa: E731
            if args.lane == "sync10":
                c0 = time.perf_counter()
                nbytes = _sync_save(os.path.join(args.ckpt_dir, f"sync-rank{pg.comm.rank}.pt"), share())
                pg.comm.barrier()
                log(event="sync_save", step=step, bytes=nbytes, seconds=time.perf_counter() - c0)
            elif args.lane == "dcp10":
                c0 = time.perf_counter()
                if pending is not None:
                    pending.result()
                state = {f"r{pg.comm.rank}.{k}": e.tensor for k, e in share().items() if hasattr(e, "tensor")}
                pending = dcp.async_save(state, checkpoint_id=os.path.join(args.ckpt_dir, f"dcp{step}"),
                                         process_group=gloo)
                log(event="dcp_stall", step=step, seconds=time.perf_counter() - c0)
        if loop.steps_applied >= args.steps:
            break
    loop.flush_checkpoints()
    if pending is not None:
        pending.result()
    log(event="done", steps=loop.steps_applied, size=pg.size())
    if args.lane == "async10":
        _throughput(args, log, pg, torch_checkpoint.entries(pg, ddp, opt, [], {"epoch": 0}))
    dist.destroy_process_group()


# ------------------------------------------------------------------ driver
def launch(args, lane: str, params: int, log_dir: Path, launcher=(), steps=None) -> tuple[dict, float]:
    ckpt = log_dir / "ckpt"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(args.ranks), "--timeout", str(args.job_timeout),
           *launcher, sys.executable, __file__, "--worker", "--lane", lane, "--params", str(params),
           "--steps", str(steps or args.steps), "--kill-step", "25", "--ckpt-dir", str(ckpt), "--log-dir", str(log_dir)]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        print(f"lane {lane} failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    shutil.rmtree(ckpt, ignore_errors=True)
    events = []
    for path in glob.glob(str(log_dir / "*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f if line.strip()]
    return {"events": sorted(events, key=lambda e: e["time"]), "rc": proc.returncode}, started


def _median(values):
    values = list(values)
    return statistics.median(values) if values else None


def lane_figures(events: list, lane: str) -> dict:
    steps = [e["step_s"] for e in events if e["event"] == "step" and e["step"] > WARMUP]
    out = {"median_step_s": _median(steps), "mean_step_s": statistics.fmean(steps) if steps else None}
    ckpts = [e for e in events if e["event"] == "checkpoint"]
    if ckpts:
        out.update(stall_s=_median(e["stall_s"] for e in ckpts), write_s=_median(e["write_s"] for e in ckpts),
                   part_bytes=_median(e["bytes"] for e in ckpts), checkpoints=len({e["step"] for e in ckpts}),
                   skipped=len({e["step"] for e in events if e["event"] == "checkpoint_skipped"}),
                   write_bytes_per_s=_median(e["bytes"] / e["write_s"] for e in ckpts))
    for kind in ("sync_save", "dcp_stall"):
        found = [e["seconds"] for e in events if e["event"] == kind]
        if found:
            out["stall_s"] = _median(found)
    for how in ("ftcomm", "plain"):
        found = [e["bytes"] / e["seconds"] for e in events if e["event"] == "throughput" and e["how"] == how]
        if found:
            out[f"{how}_bytes_per_s"] = _median(found)
    return out


def relaunch_figures(events: list, launched: float) -> dict:
    """Start-up of the first launch; death to first commit after the relaunch, in phases (rank 0
    of each launch; the relaunch's rank 0 is world rank 0 of the new job)."""
    first, again = ([e for e in events if e["event"] == "started" and e["restart"] == k] for k in (0, 1))
    kill = next(e for e in events if e["event"] == "kill")
    r0 = min(first, key=lambda e: e["rank"])
    startup = {"launch_s": r0["script"] - launched, "imports_s": r0["imports"] - r0["script"],
               "init_s": r0["init"] - r0["imports"]}
    startup["total_s"] = sum(startup.values())
    if not again:
        return {"startup": startup, "relaunched": False}
    a0 = min(again, key=lambda e: (e["time"], e["rank"]))
    resumed = next(e for e in events if e["event"] == "resumed" and e["time"] > a0["time"])
    commit = next(e for e in events if e["event"] == "commit" and e["time"] > resumed["time"])
    phases = {"launch_s": a0["script"] - kill["time"], "imports_s": a0["imports"] - a0["script"],
              "init_s": a0["init"] - a0["imports"], "load_s": resumed["load_s"],
              "redo_s": commit["time"] - resumed["time"]}
    phases["other_s"] = commit["time"] - kill["time"] - sum(phases.values())
    return {"startup": startup, "relaunched": True, "resumed_step": resumed["step"], "killed_at": kill["step"],
            "death_to_first_commit_s": commit["time"] - kill["time"], "phases": phases,
            "ratio_to_startup": (commit["time"] - kill["time"]) / startup["total_s"]}


def run_size(args, name: str) -> dict:
    params, out = SIZES[name], {}
    runs = {lane: [] for lane in LANES}
    for round_ in range(args.rounds):
        lanes = list(LANES)
        random.Random(round_).shuffle(lanes)
        for lane in lanes:
            result, _ = launch(args, lane, params, Path(args.out) / name / f"{lane}-{round_}")
            runs[lane].append(lane_figures(result["events"], lane) | {"rc": result["rc"]})
            print(f"{name} round {round_} {lane}: {runs[lane][-1]}", flush=True)
    for lane, figures in runs.items():
        out[lane] = {k: _median(f[k] for f in figures if f.get(k) is not None) for k in figures[0] if k != "rc"}
        out[lane]["rounds"] = figures
    base = out["none"]["mean_step_s"]
    for lane in LANES:
        if out[lane].get("mean_step_s") and base:
            out[lane]["step_ratio"] = out[lane]["mean_step_s"] / base
        if out[lane].get("stall_s") is not None and base:
            every = 1 if lane == "async1" else 10
            out[lane]["stall_share"] = out[lane]["stall_s"] / (every * base)
    if args.relaunch:
        hosts = Path(args.out) / name / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text("n1 slots=2\nn2 slots=2\n")
        result, launched = launch(args, "relaunch", params, Path(args.out) / name / "relaunch", steps=40,
                                  launcher=("--hostfile", str(hosts), "--fake-nodes", "--ranks-per-node", "2",
                                            "--restarts", "1"))
        out["relaunch"] = relaunch_figures(result["events"], launched) | {"rc": result["rc"]}
        print(f"{name} relaunch: {out['relaunch']}", flush=True)
    return out


def print_tables(results: dict) -> None:
    print("\n| parameters | lane | step (median) | step (mean) | / none | stall per checkpoint | stall share |")
    print("|---|---|---|---|---|---|---|")
    for name, res in results.items():
        for lane in LANES:
            r = res[lane]
            stall = f"{1e3 * r['stall_s']:.1f} ms" if r.get("stall_s") is not None else ""
            share = f"{100 * r['stall_share']:.2f}%" if r.get("stall_share") is not None else ""
            print(f"| {name} | {lane} | {1e3 * r['median_step_s']:.1f} ms | {1e3 * r['mean_step_s']:.1f} ms | "
                  f"{r.get('step_ratio', 1):.3f} | {stall} | {share} |")
    print("\n| parameters | part per rank | ftcomm's writer | plain write + fsync | ratio | beside training |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        r = res["async10"]
        if r.get("ftcomm_bytes_per_s"):
            print(f"| {name} | {r['part_bytes'] / 2**20:.1f} MiB | {r['ftcomm_bytes_per_s'] / 2**20:.0f} MiB/s | "
                  f"{r['plain_bytes_per_s'] / 2**20:.0f} MiB/s | {r['ftcomm_bytes_per_s'] / r['plain_bytes_per_s']:.2f} | "
                  f"{r['write_bytes_per_s'] / 2**20:.0f} MiB/s |")
    print("\n| parameters | start-up | death to first commit | launch | imports | init | load | redo | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, res in results.items():
        r = res.get("relaunch")
        if r and r.get("relaunched"):
            p = r["phases"]
            print(f"| {name} | {r['startup']['total_s']:.2f} s | {r['death_to_first_commit_s']:.2f} s | "
                  f"{p['launch_s']:.2f} s | {p['imports_s']:.2f} s | {p['init_s']:.2f} s | {p['load_s']:.2f} s | "
                  f"{p['redo_s']:.2f} s | {r['ratio_to_startup']:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lane", choices=(*LANES, "relaunch"), help=argparse.SUPPRESS)
    p.add_argument("--params", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kill-step", type=int, default=25, help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    p.add_argument("--log-dir", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="10M,100M", help="comma-separated: 1M, 10M, 100M (default 10M,100M)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=40, help="steps per job (default 40)")
    p.add_argument("--rounds", type=int, default=2, help="jobs per lane (default 2)")
    p.add_argument("--no-relaunch", dest="relaunch", action="store_false", help="skip the relaunch measurement")
    p.add_argument("--job-timeout", type=float, default=1200)
    p.add_argument("--out", default="results/checkpoint")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    results = {name: run_size(args, name) for name in args.sizes.split(",")}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "checkpoint.json").write_text(json.dumps(results, indent=1, default=str))
    print_tables(results)


if __name__ == "__main__":
    main()
