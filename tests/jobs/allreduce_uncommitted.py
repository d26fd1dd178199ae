"""Uncommitted allreduces (``commit=False``) and the caller's one agreement over them.

Mode "clean": three uncommitted allreduces of a bucket (results against the numpy reference,
step ids advancing, the ledger untouched until ``commit_uncommitted``), then bad input: the
corruption guard with commit=False, and one rank passing commit=True while the others pass False;
then two uncommitted allreduces voided (``void_uncommitted``) and the redo's step id.
Mode "kill": FTCOMM_FAULT kills a rank inside the second of three uncommitted allreduces; each
survivor notes its own outcome, all agree, recover, and redo the three on the survivors.
Usage: allreduce_uncommitted.py MODE COUNT
"""
import sys

import numpy as np

import ftcomm
from allreduce_cases import digest, rank_input, reference
from harness import report

mode, count = sys.argv[1], int(sys.argv[2])
comm = ftcomm.Communicator()
world_rank = comm.world_rank
comm.allreduce(np.ones(8, np.float32), step=0)  # step 0 commits on every rank


def inputs(world_rank):
    return [rank_input(world_rank, count, "float64", "sum", seed=k) for k in range(3)]


def three_steps(comm):
    """Three uncommitted bucket allreduces (two buffers each): (results, step ids, own error)."""
    results, steps = [], []
    for values in inputs(comm.world_rank):
        bucket = [values[: count // 3].copy(), values[count // 3:].copy()]
        try:
            steps.append(comm.allreduce(bucket, commit=False, chunk_bytes=4096))
        except ftcomm.FtError as exc:
            return results, steps, {"type": type(exc).__name__, "step": exc.step}
        results.append(np.concatenate(bucket))
    return results, steps, None


def exact(results, comm):
    refs = [reference(list(per_rank), "float64", "sum")
            for per_rank in zip(*(inputs(r) for r in comm.world_ranks))]
    return len(results) == 3 and all(np.array_equal(got, ref) for got, ref in zip(results, refs))


if mode == "clean":
    results, steps, error = three_steps(comm)
    ledger_before = comm.last_committed_step
    ok = comm.agree(1 if error is None else 0)
    committed = comm.commit_uncommitted() if ok else None
    bad = {}
    buf = rank_input(world_rank, count, "float32", "sum", seed=5)
    before = digest(buf)
    for name, kwargs in (("guard", {"commit": False, "checksums": True}),
                         ("mixed", {"commit": world_rank != 0})):
        try:
            comm.allreduce(buf, **kwargs)
            bad[name] = "no error"
        except ftcomm.InvalidInputError as exc:
            bad[name] = str(exc)
    # two more, voided by the caller's agreement: the redo takes the first one's id again
    voided = [comm.allreduce(rank_input(world_rank, 64, "float32", "sum", seed=k), commit=False) for k in (6, 7)]
    comm.void_uncommitted()
    redo = comm.allreduce(rank_input(world_rank, 64, "float32", "sum", seed=6), commit=False)
    report(error=error, exact=exact(results, comm), steps=steps, ledger_before=ledger_before, agreed=ok,
           committed=committed, bad=bad, unchanged=digest(buf) == before, last=comm.last_committed_step,
           voided=voided, redo=redo)
else:
    results, steps, error = three_steps(comm)
    agreed = comm.agree(1 if error is None else 0)
    if not agreed:
        comm = comm.recover()
        results, steps, redo_error = three_steps(comm)
        agreed_again = comm.agree(1 if redo_error is None else 0)
        comm.commit_uncommitted()
    report(error=error, agreed=agreed, agreed_again=agreed_again if not agreed else None, size=comm.size,
           exact=exact(results, comm), digest=digest(np.concatenate(results)) if results else None,
           steps=steps, last=comm.last_committed_step)
