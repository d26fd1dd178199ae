"""Allreduce bandwidth: ftcomm (commit on) against MPI_Allreduce (mpi4py, on the same
communicator) and torch.distributed's gloo, in the same job, interleaved.

    ftcomm-run -n 4 python benchmarks/allreduce.py            # 4 KiB .. 256 MiB
    ftcomm-run -n 2 python benchmarks/allreduce.py --max-size 64M

For each size (float32, op sum) every implementation runs `--reps` rounds (more for small sizes),
each round in a fresh random order, the same on every rank; a round's time is the slowest rank's
(MPI_MAX). Reported: the median round time, algbw = bytes / time, busbw = algbw x 2(N-1)/N (the
bytes each rank must move in a ring, so busbw is comparable across world sizes), and ftcomm's
busbw as a ratio to MPI's and gloo's. Writes results/allreduce_n{N}.json and .png.

``--checksums`` adds "ftcomm+checksums" (the transit guard against silent data corruption on)
beside "ftcomm" (off), interleaved in the same job, and their ratio (``guard_cost``: the guard's
time over the unguarded time, minus one). ``--fingerprints`` likewise adds "ftcomm+fingerprints"
(result fingerprints on, checksums off) and ``fingerprint_cost``. ``--uncommitted`` adds
"ftcomm-uncommitted" (``commit=False``: the ring alone, no undo log, no agreement; what a DDP
bucket costs under the torch backend's step-level commit, which adds one agreement per training
step), ``commit_cost`` (the committed time over it, minus one) and its ratio to MPI.

``--collective reduce_scatter``: ftcomm's committed ring reduce-scatter (``--checksums``: also
with its transit guard on) against
MPI_Reduce_scatter_block and gloo's reduce_scatter_tensor, plus "allreduce+slice" (a committed
allreduce of a copy, then this rank's block: what the torch backend did before it had a true
reduce-scatter). Sizes are the input's; busbw = algbw x (N-1)/N. Writes
results/reduce_scatter_n{N}.json and .png (no latency floor).

The latency floor: a 4-byte allreduce, ftcomm against MPI_Allreduce (``--latency-reps`` calls
each, the median per rank, then the slowest rank's), and where ftcomm's time goes: the core's
validation round, ring and agreement (``Communicator.last_phases``) and the rest, outside the core
(Python, the binding, releasing the GIL). Writes results/allreduce_latency_n{N}.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import time
from pathlib import Path

import numpy as np

import ftcomm


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def init_gloo(mpi_comm):
    """A gloo process group over the same ranks (rendezvous on localhost, port from rank 0)."""
    import torch.distributed as dist

    port = None
    if mpi_comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = mpi_comm.bcast(port, root=0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=mpi_comm.Get_rank(), world_size=mpi_comm.Get_size())
    return dist


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--min-size", default="4K", help="smallest buffer, bytes (K/M/G suffixes)")
    p.add_argument("--max-size", default="256M", help="largest buffer, bytes")
    p.add_argument("--reps", type=int, default=5, help="rounds per implementation and size")
    p.add_argument("--chunk-bytes", type=parse_size, default=None, help="ftcomm ring chunk size")
    p.add_argument("--no-gloo", action="store_true", help="skip the gloo baseline")
    p.add_argument("--latency-reps", type=int, default=300, help="calls per implementation for the 4-byte latency")
    p.add_argument("--collective", choices=("allreduce", "reduce_scatter"), default="allreduce")
    p.add_argument("--checksums", action="store_true", help="also time ftcomm with the transit guard on")
    p.add_argument("--fingerprints", action="store_true", help="also time ftcomm with result fingerprints on")
    p.add_argument("--uncommitted", action="store_true", help="also time ftcomm's allreduce with commit=False")
    p.add_argument("--out", default="results", help="directory for JSON and PNG")
    args = p.parse_args()

    comm = ftcomm.Communicator()
    mpi_comm = comm.mpi_comm
    from mpi4py import MPI

    n = comm.size
    dist = None if args.no_gloo else init_gloo(MPI.COMM_WORLD)
    sizes = []
    size = parse_size(args.min_size)
    while size <= parse_size(args.max_size):
        sizes.append(size)
        size *= 4

    def timed(fn) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        return mpi_comm.allreduce(elapsed, op=MPI.MAX)

    rows = []
    scatter = args.collective == "reduce_scatter"
    for nbytes in sizes:
        nbytes -= nbytes % (4 * n)  # whole float32 blocks per rank
        buf = np.zeros(nbytes // 4, np.float32)  # zeros stay zeros: no overflow over many rounds
        if scatter:
            impls = scatter_impls(comm, mpi_comm, MPI, dist, buf, args.chunk_bytes, args.checksums)
        else:
            impls = allreduce_impls(comm, mpi_comm, MPI, dist, buf, args.chunk_bytes)
        if args.checksums and not scatter:
            impls["ftcomm+checksums"] = lambda: comm.allreduce(buf, op="sum", chunk_bytes=args.chunk_bytes,
                                                                checksums=True)
        if args.fingerprints and not scatter:
            impls["ftcomm+fingerprints"] = lambda: comm.allreduce(buf, op="sum", chunk_bytes=args.chunk_bytes,
                                                                   fingerprints=True)
        if args.uncommitted and not scatter:
            impls["ftcomm-uncommitted"] = lambda: comm.allreduce(buf, op="sum", chunk_bytes=args.chunk_bytes,
                                                                  commit=False)
        reps = max(args.reps, min(50, (4 << 20) // nbytes))  # more rounds for small sizes
        times = {name: [] for name in impls}
        for name, fn in impls.items():
            fn()  # warm-up: page faults, scratch allocation, connections
        for rep in range(reps):
            # A fresh order each round, the same on every rank (seeded by the round): a rotation
            # keeps the cyclic order, so one lane always ran right after gloo, whose threads
            # were still busy, and measured slow.
            order = random.Random(rep).sample(list(impls), len(impls))
            for name in order:
                times[name].append(timed(impls[name]))
        row = {"bytes": nbytes, "world_size": n}
        for name, ts in times.items():
            t = statistics.median(ts)
            algbw = nbytes / t / 1e9
            factor = (n - 1) / n if scatter else 2 * (n - 1) / n
            row[name] = {"time_s": t, "algbw_GBps": algbw, "busbw_GBps": algbw * factor}
        row["ratio_vs_mpi"] = row["ftcomm"]["busbw_GBps"] / row["mpi"]["busbw_GBps"]
        if "gloo" in row:
            row["ratio_vs_gloo"] = row["ftcomm"]["busbw_GBps"] / row["gloo"]["busbw_GBps"]
        if "ftcomm+checksums" in row:
            row["guard_cost"] = row["ftcomm+checksums"]["time_s"] / row["ftcomm"]["time_s"] - 1
        if "ftcomm+fingerprints" in row:
            row["fingerprint_cost"] = row["ftcomm+fingerprints"]["time_s"] / row["ftcomm"]["time_s"] - 1
        if "ftcomm-uncommitted" in row:
            row["commit_cost"] = row["ftcomm"]["time_s"] / row["ftcomm-uncommitted"]["time_s"] - 1
            row["uncommitted_vs_mpi"] = row["ftcomm-uncommitted"]["busbw_GBps"] / row["mpi"]["busbw_GBps"]
        if "allreduce+slice" in row:
            row["ratio_vs_allreduce_slice"] = row["ftcomm"]["busbw_GBps"] / row["allreduce+slice"]["busbw_GBps"]
        rows.append(row)
        if comm.rank == 0:
            print_row(row, header=len(rows) == 1)

    if scatter:
        if comm.rank == 0:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"reduce_scatter_n{n}.json").write_text(json.dumps(rows, indent=1))
            plot(rows, out / f"reduce_scatter_n{n}.png", "reduce-scatter")
            print(f"wrote {out}/reduce_scatter_n{n}.json and .png")
        return
    floor = latency_floor(comm, mpi_comm, MPI, args.latency_reps)
    if comm.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"allreduce_n{n}.json").write_text(json.dumps(rows, indent=1))
        (out / f"allreduce_latency_n{n}.json").write_text(json.dumps(floor, indent=1))
        print("4-byte allreduce: " + ", ".join(f"{k} {v:.1f}" for k, v in floor.items() if k.endswith("_us")))
        plot(rows, out / f"allreduce_n{n}.png")
        print(f"wrote {out}/allreduce_n{n}.json and .png")


def allreduce_impls(comm, mpi_comm, MPI, dist, buf, chunk_bytes) -> dict:
    impls = {
        "ftcomm": lambda: comm.allreduce(buf, op="sum", chunk_bytes=chunk_bytes),
        "mpi": lambda: mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
    }
    if dist is not None:
        import torch

        tensor = torch.from_numpy(buf)
        impls["gloo"] = lambda: dist.all_reduce(tensor)
    return impls


def scatter_impls(comm, mpi_comm, MPI, dist, buf, chunk_bytes, checksums=False) -> dict:
    n, r = comm.size, comm.rank
    out = np.zeros(buf.size // n, np.float32)
    copy = np.empty_like(buf)

    def allreduce_slice():
        np.copyto(copy, buf)
        comm.allreduce(copy, op="sum", chunk_bytes=chunk_bytes)
        np.copyto(out, copy[r * out.size:(r + 1) * out.size])

    impls = {
        "ftcomm": lambda: comm.reduce_scatter(buf, out, op="sum", chunk_bytes=chunk_bytes),
        "mpi": lambda: mpi_comm.Reduce_scatter_block(buf, out, op=MPI.SUM),
        "allreduce+slice": allreduce_slice,
    }
    if checksums:
        impls["ftcomm+checksums"] = lambda: comm.reduce_scatter(buf, out, op="sum", chunk_bytes=chunk_bytes,
                                                                checksums=True)
    if dist is not None:
        import torch

        src, dst = torch.from_numpy(buf), torch.from_numpy(out)
        impls["gloo"] = lambda: dist.reduce_scatter_tensor(dst, src)
    return impls


def latency_floor(comm, mpi_comm, MPI, reps: int) -> dict:
    """Microseconds of a 4-byte float32 sum (see the module docstring): the medians of the rank
    whose ftcomm median is the largest, and that of MPI's slowest rank."""
    buf = np.zeros(1, np.float32)
    samples = {"ftcomm_us": [], "mpi_us": [], "validate_us": [], "ring_us": [], "agree_us": [],
               "outside_core_us": []}
    for rep in range(reps + 20):  # the first 20: warm-up
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce(buf)
        ftcomm_s = time.perf_counter() - t0
        comm.barrier()
        t0 = time.perf_counter()
        mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        mpi_s = time.perf_counter() - t0
        if rep >= 20:
            phases = comm.last_phases
            for key, seconds in (("ftcomm_us", ftcomm_s), ("mpi_us", mpi_s), ("validate_us", phases["validate_s"]),
                                 ("ring_us", phases["ring_s"]), ("agree_us", phases["agree_s"]),
                                 ("outside_core_us", ftcomm_s - sum(phases.values()))):
                samples[key].append(seconds * 1e6)
    mine = {k: statistics.median(v) for k, v in samples.items()}
    every = mpi_comm.allgather(mine)
    out = dict(max(every, key=lambda m: m["ftcomm_us"]), mpi_us=max(m["mpi_us"] for m in every))
    out["world_size"] = comm.size
    return out


IMPLS = ("ftcomm", "mpi", "gloo", "allreduce+slice", "ftcomm+checksums", "ftcomm+fingerprints", "ftcomm-uncommitted")


def print_row(row, header):
    names = [k for k in IMPLS if k in row]
    if header:
        print(f"{'size':>10} | " + " | ".join(f"{k + ' busbw GB/s':>26}" for k in names)
              + " | ftcomm/mpi | ftcomm/gloo", flush=True)
    cells = " | ".join(f"{row[k]['busbw_GBps']:26.3f}" for k in names)
    gloo = f"{row['ratio_vs_gloo']:11.2f}" if "ratio_vs_gloo" in row else f"{'-':>11}"
    guard = f" | guard cost {100 * row['guard_cost']:+.1f}%" if "guard_cost" in row else ""
    if "fingerprint_cost" in row:
        guard += f" | fingerprint cost {100 * row['fingerprint_cost']:+.1f}%"
    if "commit_cost" in row:
        guard += f" | uncommitted/mpi {row['uncommitted_vs_mpi']:.2f} | commit cost {100 * row['commit_cost']:+.1f}%"
    print(f"{human(row['bytes']):>10} | {cells} | {row['ratio_vs_mpi']:10.2f} | {gloo}{guard}", flush=True)


def plot(rows, path, collective="allreduce"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = [r["bytes"] for r in rows]
    for name in IMPLS:
        if name in rows[0]:
            ax.plot(sizes, [r[name]["busbw_GBps"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{collective}, {rows[0]['world_size']} ranks, float32 sum")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
