"""One reduce-scatter step with a bit flipped in a ring chunk on arrival (FTCOMM_FAULT
kind=bitflip at point reduce_scatter), the transit guard on, then the redo.

Usage: reduce_scatter_bitflip.py core DTYPE OP   (Communicator.reduce_scatter; the redo by hand)
       reduce_scatter_bitflip.py torch           (dist.reduce_scatter_tensor; the backend redoes it)

Every rank reports the error it raised (core: type, step, implicated ranks, whether input and
output were bitwise unchanged), the corruption events it saw, and whether its output matches the
numpy reference.
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import as_float64, make_buffer, mismatch, rank_input, reference, tolerance
from harness import report

BLOCK = 3001  # elements per rank: several 4096-byte chunks per segment


def core(dtype: str, op: str) -> None:
    comm = ftcomm.Communicator()
    n = comm.size
    comm.allreduce(np.ones(8, np.float32), step=0, checksums=True)
    src = make_buffer(rank_input(comm.world_rank, BLOCK * n, dtype, op, seed=7), dtype)
    out = make_buffer(np.full(BLOCK, -7.0), dtype)
    before_src, before_out = as_float64(src).tobytes(), as_float64(out).tobytes()
    error = None
    try:
        comm.reduce_scatter(src, out, op=op, step=1, chunk_bytes=4096, checksums=True)
    except ftcomm.SilentCorruptionError as exc:
        error = {"type": type(exc).__name__, "step": exc.step, "ranks": exc.ranks, "failed_ranks": exc.failed_ranks,
                 "unchanged": as_float64(src).tobytes() == before_src and as_float64(out).tobytes() == before_out,
                 "message": str(exc)}
        comm.reduce_scatter(src, out, op=op, step=1, chunk_bytes=4096, checksums=True)  # the redo
    whole = reference([rank_input(r, BLOCK * n, dtype, op, seed=7) for r in comm.world_ranks], dtype, op)
    mine = whole[comm.rank * BLOCK:(comm.rank + 1) * BLOCK]
    report(error=error, correct=not mismatch(as_float64(out), mine, tolerance(dtype, op)),
           last_committed=comm.last_committed_step)


def torch_backend() -> None:
    import torch
    import torch.distributed as dist

    import ftcomm.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("ftcomm")
    n, r = dist.get_world_size(), dist.get_rank()
    world_rank = dist.group.WORLD.comm.world_rank
    x = torch.arange(BLOCK * n, dtype=torch.float32) * (world_rank + 1)
    out = torch.full((BLOCK,), -7.0)
    dist.reduce_scatter_tensor(out, x)  # FTCOMM_CHECKSUMS=1: voided, then redone by the backend
    weights = sum(w + 1 for w in dist.group.WORLD.comm.world_ranks)
    expected = torch.arange(BLOCK * n, dtype=torch.float32)[r * BLOCK:(r + 1) * BLOCK] * weights
    report(correct=bool(torch.equal(out, expected)),
           corruptions=[[e.ranks, e.where, e.action] for e in ftcomm.corruptions()])
    dist.destroy_process_group()


if sys.argv[1] == "core":
    core(sys.argv[2], sys.argv[3])
else:
    torch_backend()
