"""GPU benchmarks for scripts/gpu_check.sh (not a pytest module).

    python bench_gpu.py kernel OUT.json
        The reduction kernel (sum, in place) against torch's in-place add on the same tensors,
        float32 and bfloat16, 64 and 256 MiB per operand. Times from CUDA events over 50 calls
        after a warm-up; bandwidth counts 3 bytes moved per byte of buffer (two reads, one write).
        ratio = torch time / ftcomm time (>= 0.9 is the target).

    ftcomm-run -n N python bench_gpu.py allreduce OUT.json
        ftcomm's allreduce of a CUDA tensor against torch.distributed's gloo allreduce of the same
        CUDA tensor, in the same job, every rank on the one GPU. 1, 16 and 64 MiB float32; the
        median of 7 timed calls after 2 warm-ups, each call bracketed by barriers and a device
        synchronisation. ratio = gloo time / ftcomm time (>= 1.0 is the target).

    ftcomm-run -n N python bench_gpu.py backends OUT.json [cuda|cpu]
        The torch backends on the same tensors, in the same job: dist.all_reduce over "ftcomm",
        "gloo" and "nccl" (NCCL only with one GPU per rank: it refuses two ranks on one device),
        float32 sum from 1 MiB to 1 GiB (algbw = bytes / time, busbw = algbw x 2(N-1)/N; the
        median of 5 timed calls after 2 warm-ups, the slowest rank's time), and the step time of
        DDP with AdamW on an MLP of about 19M parameters over each backend (median of 10 steps
        after 3). ``cpu``: the same on CPU tensors with sizes up to 4 MiB and a 2.7M model (the
        check's dry run).

    FTCOMM_DATA_PLANE=nccl ftcomm-run -n N python bench_gpu.py nccl_plane OUT.json
        Needs one GPU per rank. DDP's step time with AdamW on the same 19M-parameter MLP, inside
        ``ftcomm.torch.resilient`` on the ftcomm group whose buckets go through the inner NCCL
        group (one ULFM agreement per step), against a torch NCCL group; rounds alternate which
        goes first, 10 steps each after 3, and ``plane_cost`` is the median of the per-round
        ratios minus 1 (the slowest rank's times; target: at most +3%).
"""
import json
import os
import statistics
import sys
import time


def kernel(out_path):
    import torch

    from ftcomm import _C, cuda

    rows = []
    for dtype, code in [(torch.float32, 0), (torch.bfloat16, 3)]:
        for mib in (64, 256):
            n = mib * (1 << 20) // torch.tensor([], dtype=dtype).element_size()
            a = torch.randn(n, device="cuda").to(dtype)
            b = torch.randn(n, device="cuda").to(dtype)
            stream = torch.cuda.current_stream().cuda_stream
            iters = 50
            ours_ms = _C.cuda_time_reduce(code, 0, a.data_ptr(), b.data_ptr(), n, iters, stream)
            b.add_(a)  # warm-up
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                b.add_(a)
            stop.record()
            stop.synchronize()
            torch_ms = start.elapsed_time(stop)
            moved = 3 * mib * (1 << 20) * iters
            rows.append({"dtype": str(dtype).replace("torch.", ""), "mib": mib,
                         "ftcomm_gb_s": moved / (ours_ms * 1e-3) / 1e9,
                         "torch_gb_s": moved / (torch_ms * 1e-3) / 1e9,
                         "ratio": torch_ms / ours_ms})
            # Correctness on the benchmark's own data: one more reduce equals one more add.
            ref = b.clone()
            ref.add_(a)
            cuda.reduce_(a, b, "sum")
            torch.cuda.synchronize()
            rows[-1]["equal_to_torch"] = bool(torch.equal(ref, b))
            print(json.dumps(rows[-1]), flush=True)
    result = {"kernel": rows, "device": torch.cuda.get_device_name(),
              "min_ratio": min(r["ratio"] for r in rows), "target": 0.9}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def allreduce(out_path):
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import ftcomm

    comm = ftcomm.Communicator()
    rank, size = comm.rank, comm.size
    world = MPI.COMM_WORLD
    port = world.bcast(29500 + (os.getpid() % 2000) if rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.cuda.set_device(0)
    rows = []
    for mib in (1, 16, 64):
        n = mib * (1 << 20) // 4
        t = torch.ones(n, device="cuda") * (rank + 1)

        def timed(fn):
            times = []
            for i in range(9):
                torch.cuda.synchronize()
                world.Barrier()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if i >= 2:
                    times.append(world.allreduce(dt, op=MPI.MAX))  # the slowest rank's time
            return statistics.median(times)

        ours = timed(lambda: comm.allreduce(t, op="sum"))
        stats = dict(ftcomm.cuda.last_stats)
        gloo = timed(lambda: dist.all_reduce(t))
        expected = float(sum(range(1, size + 1))) * size ** 17  # 18 sums: S, then x size each
        ok = bool(torch.allclose(t[:1000], torch.full((1000,), expected, device="cuda"), rtol=1e-5))
        rows.append({"ranks": size, "mib": mib, "ftcomm_s": ours, "gloo_s": gloo, "ratio": gloo / ours,
                     "ftcomm_phases_s": stats, "values_ok": ok})
        if rank == 0:
            print(json.dumps(rows[-1]), flush=True)
        t.fill_(rank + 1)
    dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"allreduce": rows, "min_ratio": min(r["ratio"] for r in rows), "target": 1.0,
                       "cuda_aware_mpi": ftcomm.cuda.cuda_aware_mpi()}, f, indent=1)


def _slowest_median(fn, sync, warmup: int, timed: int) -> float:
    """Median over ``timed`` calls (after ``warmup``) of the slowest rank's time of ``fn()``."""
    import torch
    import torch.distributed as dist

    times = []
    for i in range(warmup + timed):
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(float(dt))
    return statistics.median(times)


def backends(out_path, device="cuda"):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ftcomm.torch  # noqa: F401  (registers "ftcomm")

    on_gpu = device == "cuda"
    dist.init_process_group("ftcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    if on_gpu:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    groups = {"ftcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    skipped = {}
    if not on_gpu:
        skipped["nccl"] = "no GPU (dry run)"
    elif torch.cuda.device_count() < size:
        skipped["nccl"] = (f"{size} ranks share {torch.cuda.device_count()} GPU(s): NCCL refuses two ranks on "
                           "one device ('Duplicate GPU detected')")
    else:
        groups["nccl"] = dist.new_group(backend="nccl")
    rows = []
    for mib in ((1, 4, 16, 64, 256, 1024) if on_gpu else (1, 4)):
        n = mib * (1 << 20) // 4
        t = torch.full((n,), float(rank + 1), device=device)
        row = {"ranks": size, "mib": mib}
        for name, group in groups.items():
            seconds = _slowest_median(lambda: dist.all_reduce(t, group=group), sync, 2, 5)
            algbw = mib * (1 << 20) / seconds / 1e9
            row[name] = {"s": seconds, "algbw_gb_s": algbw, "busbw_gb_s": algbw * 2 * (size - 1) / size}
            t.fill_(float(rank + 1))
        dist.all_reduce(t)
        row["values_ok"] = bool(torch.all(t == size * (size + 1) / 2))
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    width = 3400 if on_gpu else 900  # Linear(1024,w)-ReLU-Linear(w,w)-ReLU-Linear(w,1024): 18.5M / 2.7M weights
    ddp_rows = {}
    for name, group in groups.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                    torch.nn.ReLU(), torch.nn.Linear(width, 1024)).to(device)
        ddp = DDP(model, process_group=group)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
        x = torch.randn(32, 1024, device=device)

        def step():
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()

        ddp_rows[name] = {"step_s": _slowest_median(step, sync, 3, 10),
                          "params": sum(p.numel() for p in model.parameters())}
    if rank == 0:
        result = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "allreduce": rows, "ddp": ddp_rows,
                  "skipped": skipped,
                  "ftcomm_over_gloo_busbw": [r["ftcomm"]["busbw_gb_s"] / r["gloo"]["busbw_gb_s"] for r in rows],
                  "ddp_step_ratio_gloo_over_ftcomm": ddp_rows["gloo"]["step_s"] / ddp_rows["ftcomm"]["step_s"]}
        print(json.dumps({"ddp": ddp_rows, "skipped": skipped}), flush=True)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


def nccl_plane(out_path, rounds: int = 6):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    import ftcomm.torch

    dist.init_process_group("ftcomm")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    plane = dist.group.WORLD.data_plane
    assert plane.name == "nccl", f"the ftcomm group's data plane is {plane.name}: {ftcomm.cuda_status()}"
    groups = {"ftcomm+nccl-plane": dist.group.WORLD, "nccl": dist.new_group(backend="nccl")}
    x = torch.randn(32, 1024, device="cuda")
    replicas = {}
    for name, group in groups.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 3400), torch.nn.ReLU(), torch.nn.Linear(3400, 3400),
                                    torch.nn.ReLU(), torch.nn.Linear(3400, 1024)).cuda()
        ddp = DDP(model, process_group=group)
        replicas[name] = (ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-4))

    def run(name, steps):
        ddp, opt = replicas[name]
        batches = DataLoader(TensorDataset(torch.arange(steps)), batch_size=1)  # resilient() takes a DataLoader
        torch.cuda.synchronize()
        groups["nccl"].barrier()
        t0 = time.perf_counter()
        for _ in (ftcomm.torch.resilient(batches) if name != "nccl" else batches):
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    for name in groups:
        run(name, 3)
    times = {name: [] for name in groups}
    for r in range(rounds):
        for name in (list(groups) if r % 2 == 0 else list(reversed(groups))):
            times[name].append(run(name, 10))
    t = torch.tensor([times[name] for name in groups], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["nccl"])  # the slowest rank's time
    if rank == 0:
        rows = dict(zip(groups, t.cpu().tolist()))
        cost = statistics.median(a / b for a, b in zip(rows["ftcomm+nccl-plane"], rows["nccl"])) - 1
        result = {"device": torch.cuda.get_device_name(), "ranks": size, "step_s": rows,
                  "plane_allreduces": plane.completed["allreduce"], "plane_cost": cost}
        print(json.dumps(result), flush=True)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
    del replicas
    dist.destroy_process_group()


if __name__ == "__main__":
    {"kernel": kernel, "allreduce": allreduce, "backends": backends, "nccl_plane": nccl_plane}[sys.argv[1]](*sys.argv[2:])
