"""What the disk tier costs a training step, how fast it writes, and how long a dead job takes to
train again, all measured in one run.

    python benchmarks/checkpoint.py                            # 10M and 100M parameters, 4 ranks
    python benchmarks/checkpoint.py --sizes 10M --cycles 3 --out results/checkpoint

The job: DDP over the "ftcomm" backend with ``ftcomm.torch.ZeroRedundancyOptimizer`` (AdamW, one
replica) on the MLP of benchmarks/mttr.py, in a ``resilient`` loop. The lanes share one job (the
machine's load changes from one job to the next; the lanes see the same), in phases of 20 steps,
each lane once per cycle in a fresh random order:

- ``none``: no checkpoint;
- ``async1``, ``async10``: ftcomm's asynchronous checkpoints (``AsyncCheckpointer``, what
  ``resilient(checkpoint_dir=..., checkpoint_every=N)`` runs) every step, and every 10 steps
  (at steps 5 and 15 of the phase);
- ``sync10``: at steps 5 and 15 each rank ``torch.save``s its share (its slice of the model, its
  optimizer shard) and fsyncs, then a barrier: the step waits for the disk;
- ``dcp10``: at steps 5 and 15 torch's own ``torch.distributed.checkpoint.async_save`` of the
  same bytes (each rank its share under names of its own, over a gloo group), waiting for the
  previous one first, as torch's documentation does.

At a phase's end the writes still running are waited for; that step is left out. Step time = from
one loop body's start to the next one's (staging, agreements, data, all of it). Reported per lane:
the median and the mean step time and their ratio to ``none``'s, and the stall per checkpoint
(staging for ftcomm, the whole save for ``sync10``, the call for ``dcp10``) and its share of the
10 steps between two checkpoints. The lanes' phases differ by up to 10-20% here whatever they run
(the machine is shared), so for ``async10`` the steps that ran beside a write are also compared
with the other steps of the same phases: what the write costs the steps beside it, per checkpoint.

Write throughput: after training, every rank writes its checkpoint part
with the background writer's own code and, alternately, the same bytes with one sequential write
and fsync (all ranks at once, five times each, in alternating order): the ratio is the format's cost on this disk. The
writes that ran beside training are reported too (bytes / seconds of each background write).

Relaunch (``--relaunch``, on by default): 2 made-up nodes x 2 ranks (``ftcomm-run --fake-nodes
--restarts 1``), a checkpoint every 10 steps; at step 25 node n2's daemon is killed, the whole
job ends, ftcomm-run relaunches it on n1 and it resumes from the checkpoint of step 20. Reported:
the job's own start-up (launch, imports, ``init_process_group``) and, from the daemon's death to
the first committed step after the relaunch: launch (the death to the relaunched script's first
line: the old job's end, the backoff, mpirun), imports, ``init_process_group``, set-up (the
script builds its data, model, DDP and optimizer), load (the checkpoint: checked, read, the shards
replicated) and redo (the first step after it). "Death to resumed" ends when the state is
loaded (before the redo): the resume itself, what the target of start-up + 2 s is about.

The relaunch runs twice, in the same run: cold (``FTCOMM_WARM=0``: from the checkpoint of step
20, the steps since redone) and warm (the default: from the nodes' shared memory at step 25, the
last committed; ``training/warm_resume.py``); reported with the warm load's speed-up over the
cold one, the warm death to resumed over the job's own start-up, and the same for the death to
the first commit.

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

from mttr_torch import Events  # noqa: E402  (this script's folder; imports nothing heavy)

REPO = Path(__file__).resolve().parent.parent
SIZES = {"1M": 1_000_000, "10M": 10_000_000, "100M": 100_000_000}
LANES = ("none", "async1", "async10", "sync10", "dcp10")
PHASE = 20  # steps per lane and cycle
WARMUP = 5  # steps left out of the step-time figures (first touches, DDP's bucket rebuild)


# ------------------------------------------------------------------ worker (inside ftcomm-run)
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
    every rank at once, five times (the disk here is shared: its speed varies by 4x from one
    second to the next)."""
    from ftcomm.training.checkpoint import Blob, dcp_parts
    from ftcomm.training.checkpoint.staging import StagingBuffers

    staged = StagingBuffers().stage(part)
    tensors = [e.tensor for e in staged.values() if not isinstance(e, Blob)]
    for round_ in range(5):
        for how in ("ftcomm", "plain") if round_ % 2 == 0 else ("plain", "ftcomm"):
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
    """Relaunch: the lowest rank of ``node`` SIGKILLs the node's PRRTE daemon (its parent), its
    node peers, and itself: a node crash, which ends the whole job under PRRTE 3."""
    mine = [w for w, (n, _) in pids.items() if n == node]
    if pg.comm.world_rank != min(mine):
        return
    log(event="kill", step=step)
    os.kill(os.getppid(), signal.SIGKILL)
    for w in mine:
        if w != pg.comm.world_rank:
            os.kill(pids[w][1], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _phases(cycles: int) -> list:
    """The lane of each phase: every lane once per cycle, in a fresh random order each cycle (the
    same on every rank)."""
    order = []
    for cycle in range(cycles):
        lanes = list(LANES)
        random.Random(cycle).shuffle(lanes)
        order += lanes
    return order


class LaneActions:
    """What each lane does after an applied step ``k`` (1..PHASE) of its phase, and at the phase's
    end (``drain``: the writes still running are waited for, outside the timed steps)."""

    def __init__(self, args, log, pg, entries):
        from ftcomm.training.checkpoint import AsyncCheckpointer

        self.args, self.log, self.pg, self.entries = args, log, pg, entries
        self.writers = {every: AsyncCheckpointer(os.path.join(args.ckpt_dir, f"async{every}"), every,
                                                 log=lambda every=every, **e: log(lane=f"async{every}", **e))
                        for every in (1, 10)}
        self.gloo, self.pending = None, None

    def after_step(self, lane: str, phase: int, k: int) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        comm = self.pg.comm
        if lane == "async1":
            self.writers[1].at_step(comm, phase * PHASE + k, self.entries)
        elif lane == "async10":
            self.writers[10].at_step(comm, phase * PHASE + k + 5, self.entries)  # starts at k = 5 and 15
        elif lane == "sync10" and k % 10 == 5:
            c0 = time.perf_counter()
            nbytes = _sync_save(os.path.join(self.args.ckpt_dir, f"sync-rank{comm.rank}.pt"), self.entries())
            comm.barrier()
            self.log(event="sync_save", lane=lane, bytes=nbytes, seconds=time.perf_counter() - c0)
        elif lane == "dcp10" and k % 10 == 5:
            c0 = time.perf_counter()
            if self.gloo is None:
                self.gloo = dist.new_group(backend="gloo")
            if self.pending is not None:
                self.pending.result()
            state = {f"r{comm.rank}.{n}": e.tensor for n, e in self.entries().items() if hasattr(e, "tensor")}
            self.pending = dcp.async_save(state, process_group=self.gloo,
                                          checkpoint_id=os.path.join(self.args.ckpt_dir, f"dcp{phase}-{k}"))
            self.log(event="dcp_stall", lane=lane, seconds=time.perf_counter() - c0)

    def drain(self) -> None:
        for writer in self.writers.values():
            writer.finish(self.pg.comm)
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import ftcomm.torch
    from ftcomm.torch.loop import checkpoint as torch_checkpoint

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
    relaunch = args.lane == "relaunch"
    phases = _phases(args.cycles)
    steps = args.steps if relaunch else len(phases) * PHASE
    gen = torch.Generator().manual_seed(1)
    n = 64 * pg.size() * (steps + 5)
    data = TensorDataset(torch.randn(n, 256, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data, shuffle=True, seed=0))
    loop = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt, checkpoint_dir=args.ckpt_dir if relaunch else None,
                                  checkpoint_every=10, log_path=os.path.join(args.log_dir, "loop.rank{rank}.jsonl"))
    os.makedirs(args.ckpt_dir, exist_ok=True)
    entries = lambda: torch_checkpoint.entries(pg, ddp, opt, [], {"epoch": 0})  # noqa: E731
    actions = None if relaunch else LaneActions(args, log, pg, entries)
    pids = {}
    if relaunch:  # every rank's node and pid, while all are alive
        gathered = [None] * pg.size()
        dist.all_gather_object(gathered, [pg.comm.world_rank, ftcomm.settings.node_name_override(), os.getpid()])
        pids = {w: (node, pid) for w, node, pid in gathered}
    last = None
    for _ in loop.epochs(10**6):
        for x, y in loop:
            now, done = time.perf_counter(), loop.steps_applied
            phase, k = divmod(done - 1, PHASE)
            if last is not None and done > WARMUP and (relaunch or k + 1 < PHASE):  # not a phase's drained step
                log(event="step", step=done, step_s=now - last, lane="relaunch" if relaunch else phases[phase])
            last = now
            if done >= steps:
                break
            if relaunch and restart == 0 and done == args.kill_step:
                _kill_node(log, pg, pids, "n2", done)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if actions is None or loop.step_skipped:
                continue
            phase, k = divmod(done, PHASE)  # the step just applied: done + 1
            actions.after_step(phases[phase], phase, k + 1)
            if k + 1 == PHASE:
                actions.drain()
        if loop.steps_applied >= steps:
            break
    loop.flush_checkpoints()
    log(event="done", steps=loop.steps_applied, size=pg.size())
    if not relaunch:
        _throughput(args, log, pg, entries())
    dist.destroy_process_group()


# ------------------------------------------------------------------ driver
def launch(args, lane: str, params: int, log_dir: Path, launcher=(), env=None) -> tuple[dict, float]:
    ckpt = log_dir / "ckpt"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", str(args.ranks), "--timeout", str(args.job_timeout),
           *launcher, sys.executable, __file__, "--worker", "--lane", lane, "--params", str(params),
           "--cycles", str(args.cycles), "--steps", "40", "--kill-step", "25", "--ckpt-dir", str(ckpt),
           "--log-dir", str(log_dir)]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        print(f"{lane} job failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
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
    """Step times of the lane's phases (every rank), its stalls and writes."""
    mine = [e for e in events if e.get("lane") == lane]
    steps = [e["step_s"] for e in mine if e["event"] == "step"]
    out = {"median_step_s": _median(steps), "mean_step_s": statistics.fmean(steps) if steps else None,
           "steps": len(steps)}
    ckpts = [e for e in mine if e["event"] == "checkpoint"]
    if ckpts and lane == "async10":
        out.update(beside_write(mine, ckpts))
    if ckpts:
        out.update(stall_s=_median(e["stall_s"] for e in ckpts), write_s=_median(e["write_s"] for e in ckpts),
                   part_bytes=_median(e["bytes"] for e in ckpts), checkpoints=len({e["step"] for e in ckpts}),
                   skipped=len({e["step"] for e in mine if e["event"] == "checkpoint_skipped"}),
                   write_bytes_per_s=_median(e["bytes"] / e["write_s"] for e in ckpts))
    stalls = [e["seconds"] for e in mine if e["event"] in ("sync_save", "dcp_stall")]
    if stalls:
        out["stall_s"] = _median(stalls)
    return out


def beside_write(mine: list, ckpts: list) -> dict:
    """Steps of the async10 phases that ran while a write was in flight (from the step after it
    started, k = 5 or 15 of the phase, to the agreement that completed it) against the others of
    the same phases, every rank: what the write costs the steps beside it, per checkpoint."""
    busy, idle = [], []
    for rank in {e["rank"] for e in mine}:
        writes = [(e["step"] - 5, e["time"]) for e in ckpts if e["rank"] == rank]  # the schedule's step is k + 5
        for e in (e for e in mine if e["event"] == "step" and e["rank"] == rank):
            during = any(s < e["step"] and e["time"] <= t for s, t in writes)
            (busy if during else idle).append(e["step_s"])
    if not busy or not idle:
        return {}
    lost = sum(b - _median(idle) for b in busy) / len({(e["rank"], e["step"]) for e in ckpts})
    return {"busy_step_s": _median(busy), "idle_step_s": _median(idle), "busy_steps": len(busy),
            "lost_per_checkpoint_s": lost}


def throughput_figures(events: list) -> dict:
    out = {}
    for how in ("ftcomm", "plain"):
        found = [e for e in events if e["event"] == "throughput" and e["how"] == how]
        out[f"{how}_bytes_per_s"] = _median(e["bytes"] / e["seconds"] for e in found)
        out["part_bytes"] = _median(e["bytes"] for e in found if how == "ftcomm") or out.get("part_bytes")
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
    load_start = resumed["time"] - resumed["load_s"]
    phases = {"launch_s": a0["script"] - kill["time"], "imports_s": a0["imports"] - a0["script"],
              "init_s": a0["init"] - a0["imports"], "setup_s": load_start - a0["init"], "load_s": resumed["load_s"],
              "redo_s": commit["time"] - resumed["time"]}
    return {"startup": startup, "relaunched": True, "resumed_step": resumed["step"], "killed_at": kill["step"],
            "death_to_resumed_s": resumed["time"] - kill["time"],
            "death_to_first_commit_s": commit["time"] - kill["time"], "phases": phases,
            "ratio_to_startup": (commit["time"] - kill["time"]) / startup["total_s"]}


def lanes_figures(args, name: str, params: int) -> dict:
    """The lanes' job at one model size, and its figures."""
    result, _ = launch(args, "lanes", params, Path(args.out) / name / "lanes")
    out = {lane: lane_figures(result["events"], lane) for lane in LANES}
    out["throughput"] = throughput_figures(result["events"])
    out["rc"] = result["rc"]
    base = out["none"]
    for lane in LANES:
        r = out[lane]
        if r["mean_step_s"] and base["mean_step_s"]:
            r["mean_ratio"] = r["mean_step_s"] / base["mean_step_s"]
            r["median_ratio"] = r["median_step_s"] / base["median_step_s"]
        if r.get("stall_s") is not None and base["mean_step_s"]:
            r["stall_share"] = r["stall_s"] / ((1 if lane == "async1" else 10) * base["mean_step_s"])
    print(f"{name} lanes: {json.dumps(out)}", flush=True)
    return out


def run_size(args, name: str) -> dict:
    """The lanes' job, then the relaunch job, for one model size."""
    params = SIZES[name]
    out = {}
    if not args.only_relaunch:
        out = lanes_figures(args, name, params)
    if args.relaunch:
        hosts = Path(args.out) / name / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text("n1 slots=2\nn2 slots=2\n")
        # warm: from the nodes' shared memory (the default); cold: FTCOMM_WARM=0, from disk
        for tier, warm in (("relaunch", "0"), ("relaunch_warm", "1")):
            result, launched = launch(args, "relaunch", params, Path(args.out) / name / tier,
                                      launcher=("--hostfile", str(hosts), "--fake-nodes", "--ranks-per-node", "2",
                                                "--restarts", "1"), env={"FTCOMM_WARM": warm})
            out[tier] = relaunch_figures(result["events"], launched) | {"rc": result["rc"]}
            print(f"{name} {tier}: {json.dumps(out[tier])}", flush=True)
        cold, warm = out["relaunch"], out["relaunch_warm"]
        if cold.get("relaunched") and warm.get("relaunched"):
            out["warm_speedup"] = cold["death_to_first_commit_s"] / warm["death_to_first_commit_s"]
            out["warm_over_startup_s"] = warm["death_to_first_commit_s"] - warm["startup"]["total_s"]
            out["warm_load_speedup"] = cold["phases"]["load_s"] / warm["phases"]["load_s"]
            out["warm_resumed_over_startup_s"] = warm["death_to_resumed_s"] - warm["startup"]["total_s"]
    return out


def print_tables(results: dict) -> None:
    if all("none" in res for res in results.values()):
        print_lane_tables(results)
    print_relaunch_table(results)


def print_lane_tables(results: dict) -> None:
    print("\n| parameters | lane | step (median) | / none | step (mean) | / none | stall per checkpoint | stall share |")
    print("|---|---|---|---|---|---|---|---|")
    for name, res in results.items():
        for lane in LANES:
            r = res[lane]
            stall = f"{1e3 * r['stall_s']:.1f} ms" if r.get("stall_s") is not None else ""
            share = f"{100 * r['stall_share']:.2f}%" if r.get("stall_share") is not None else ""
            print(f"| {name} | {lane} | {1e3 * r['median_step_s']:.1f} ms | {r.get('median_ratio', 1):.3f} | "
                  f"{1e3 * r['mean_step_s']:.1f} ms | {r.get('mean_ratio', 1):.3f} | {stall} | {share} |")
    print("\n| parameters | steps beside a write | steps without | lost per checkpoint, share of 10 steps |")
    print("|---|---|---|---|")
    for name, res in results.items():
        r = res["async10"]
        if r.get("busy_step_s"):
            share = r["lost_per_checkpoint_s"] / (10 * res["none"]["mean_step_s"])
            print(f"| {name} | {1e3 * r['busy_step_s']:.0f} ms | {1e3 * r['idle_step_s']:.0f} ms | "
                  f"{r['lost_per_checkpoint_s']:.2f} s, {100 * share:.1f}% |")
    print("\n| parameters | part per rank | ftcomm's writer | plain write + fsync | ratio | beside training |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        r, beside = res["throughput"], res["async10"].get("write_bytes_per_s") or 0
        if r.get("ftcomm_bytes_per_s"):
            print(f"| {name} | {r['part_bytes'] / 2**20:.1f} MiB | {r['ftcomm_bytes_per_s'] / 2**20:.0f} MiB/s | "
                  f"{r['plain_bytes_per_s'] / 2**20:.0f} MiB/s | {r['ftcomm_bytes_per_s'] / r['plain_bytes_per_s']:.2f} | "
                  f"{beside / 2**20:.0f} MiB/s |")


def print_relaunch_table(results: dict) -> None:
    print("\n| parameters | resumed from | start-up | death to resumed | death to first commit | launch | imports | init "
          "| set-up | load | redo | ratio to start-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, res in results.items():
        for tier, source in (("relaunch", "disk"), ("relaunch_warm", "memory")):
            r = res.get(tier)
            if r and r.get("relaunched"):
                p = r["phases"]
                print(f"| {name} | {source} (step {r['resumed_step']}) | {r['startup']['total_s']:.2f} s | "
                      f"{r['death_to_resumed_s']:.2f} s | "
                      f"{r['death_to_first_commit_s']:.2f} s | {p['launch_s']:.2f} s | {p['imports_s']:.2f} s | "
                      f"{p['init_s']:.2f} s | {p['setup_s']:.2f} s | {p['load_s']:.2f} s | {p['redo_s']:.2f} s | "
                      f"{r['ratio_to_startup']:.2f} |")
        if res.get("warm_speedup"):
            print(f"| {name} | warm: load {res['warm_load_speedup']:.1f}x faster than cold, death to resumed = "
                  f"start-up {res['warm_resumed_over_startup_s']:+.2f} s, death to first commit "
                  f"{res['warm_speedup']:.1f}x faster (start-up {res['warm_over_startup_s']:+.2f} s) "
                  "| | | | | | | | | | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lane", choices=("lanes", "relaunch"), help=argparse.SUPPRESS)
    p.add_argument("--params", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kill-step", type=int, default=25, help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    p.add_argument("--log-dir", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="10M,100M", help="comma-separated: 1M, 10M, 100M (default 10M,100M)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=40, help=argparse.SUPPRESS)
    p.add_argument("--cycles", type=int, default=2,
                   help=f"phases of {PHASE} steps per lane in the lanes' job, in a fresh order each cycle (default 2)")
    p.add_argument("--no-relaunch", dest="relaunch", action="store_false", help="skip the relaunch measurement")
    p.add_argument("--only-relaunch", action="store_true", help="skip the lanes' job: the relaunch measurement alone")
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
