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


if __name__ == "__main__":
    {"kernel": kernel, "allreduce": allreduce}[sys.argv[1]](sys.argv[2])
