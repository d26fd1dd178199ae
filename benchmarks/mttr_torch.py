"""The torch path of benchmarks/mttr.py (``--path torch``): one rank's training job, launched by
mttr.py under ftcomm-run. DDP over the "ftcomm" backend with ``ftcomm.torch.ZeroRedundancyOptimizer``
(AdamW) on the MLP of mttr.py, a DataLoader with a DistributedSampler, and the loop in
``ftcomm.torch.resilient``. It writes the JSON-lines events mttr.py's driver reads (``step``,
``recovered``, ``first_commit``, ``checkpoint``, ``restored``, ``summary``).

memory: k replicas; world rank N-1 is SIGKILLed in the shard update of step ``--kill-step``;
    the survivors void the step, recover (shrink, or a spare with ``--policy spares``), rebuild the
    lost shard from its buddy's replica and redo the step.
disk: no replicas, the loop without ``resilient``; every ``--ckpt-every`` steps the model and the
    whole optimizer state are saved with ``torch.distributed.checkpoint`` (over a gloo group: DCP
    needs gather, which ftcomm's backend does not offer). The kill ends the job; mttr.py relaunches
    it with ``--resume``, the ranks load the latest checkpoint and redo the steps since.
"""
from __future__ import annotations

import json
import os
import resource
import time


class Events:
    """Appends one JSON line per event to ``log_dir/rank{world rank}.jsonl``."""

    def __init__(self, log_dir: str, world_rank: int):
        os.makedirs(log_dir, exist_ok=True)
        self.path, self.world_rank = os.path.join(log_dir, f"rank{world_rank}.jsonl"), world_rank

    def __call__(self, **event) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": time.time(), "rank": self.world_rank, **event}) + "\n")


def _dcp_template(model, opt) -> dict:
    """A state of the right keys and shapes for ``dcp.load`` (AdamW's slots and step)."""
    import torch

    params = [p for g in opt.param_groups for p in g["params"]]
    state = {i: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
             for i, p in enumerate(params)}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": list(range(len(params)))}
              for g in opt.param_groups]
    return {"model": model.state_dict(), "optim": {"state": state, "param_groups": groups},
            "progress": {"step": torch.tensor(0)}}


def _save(model, opt, step: int, ckpt_dir: str, gloo) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = os.path.join(ckpt_dir, f"step{step:06d}")
    dcp.save({"model": model.state_dict(), "optim": opt.full_state_dict(), "progress": {"step": torch.tensor(step)}},
             checkpoint_id=path, process_group=gloo)
    if dist.get_rank() == 0:  # LATEST names a complete checkpoint only
        tmp = os.path.join(ckpt_dir, "LATEST.tmp")
        with open(tmp, "w") as f:
            f.write(path)
        os.replace(tmp, os.path.join(ckpt_dir, "LATEST"))


def _restore(model, opt, ckpt_dir: str, gloo) -> int:
    import torch.distributed.checkpoint as dcp

    with open(os.path.join(ckpt_dir, "LATEST")) as f:
        path = f.read()
    state = _dcp_template(model, opt)
    dcp.load(state, checkpoint_id=path, process_group=gloo)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    opt.sharded.step_id = int(state["progress"]["step"])
    return opt.sharded.step_id


def worker(args, model) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import ftcomm.torch
    from ftcomm import fault

    dist.init_process_group("ftcomm")  # a spare waits in `import ftcomm.torch` until promoted
    world_rank = dist.group.WORLD.comm.world_rank
    log = Events(args.log_dir, world_rank)
    disk = args.mode == "disk"
    gloo = dist.new_group(backend="gloo") if disk else None
    ddp = DDP(model)
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-4,
                                               replicas=0 if disk else args.replicas)
    n = 4096
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(n, 256, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=max(1, args.batch // dist.get_world_size()), sampler=sampler)
    if disk and args.resume:
        t0 = time.time()
        log(event="restored", step=_restore(model, opt, args.ckpt_dir, gloo), load_s=time.time() - t0)
    if not args.resume:
        fault.inject("shard_update", rank=dist.get_world_size() - 1, step=args.kill_step)
    batches = loader if disk else ftcomm.torch.resilient(loader, model=ddp, optimizer=opt)
    epochs = range(args.steps) if disk else batches.epochs(args.steps)  # far more than needed
    after_failure = False
    try:
        for epoch in epochs:
            if disk:
                sampler.set_epoch(epoch)
            for x, y in batches:
                if opt.sharded.step_id >= args.steps:
                    raise StopIteration
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                if not disk and batches.step_skipped:
                    after_failure = True
                    log(event="recovered", step=opt.sharded.step_id + 1, **(opt.last_recovery or {}),  # the interrupted step
                        rebuild_phases=(opt.last_rebuild or {}).get("phases"))
                    continue
                step = opt.sharded.step_id
                log(event="step", step=step, world_size=dist.get_world_size(), step_s=time.perf_counter() - t0,
                    **{f"{k}_s": v for k, v in opt.sharded.timing.items()})
                if after_failure:
                    log(event="first_commit", step=step)
                    after_failure = False
                if disk and step % args.ckpt_every == 0:
                    c0 = time.time()
                    _save(model, opt, step, args.ckpt_dir, gloo)
                    log(event="checkpoint", step=step, seconds=time.time() - c0, bytes=4 * 3 * opt.sharded.numel)
    except StopIteration:
        pass
    except (ftcomm.FtError, RuntimeError) as err:
        if disk:  # the classic way: a failure ends the job
            log(event="abort", step=opt.sharded.step_id, error=type(err).__name__)
            os._exit(3)
        raise
    if dist.get_rank() == 0:
        log(event="summary", peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            replica_bytes=opt.sharded.store.nbytes, shard_bytes=opt.sharded.shard_bytes, params=opt.sharded.numel)
