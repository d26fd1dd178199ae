"""The allreduce's fault cases: a rank killed at each injection point of the allreduce. Every survivor
raises the same error (same step, same failed ranks), its buffer bitwise unchanged; the retry
after recover() equals the reference over the survivors, bitwise identical on every survivor;
a replay of the committed step is a no-op."""
import pytest

from harness import JOBS, run_job

COUNT = 10007  # 3 chunks per segment at 4096-byte chunks and 4 ranks


def points(n):
    last = n - 2
    return [
        ("before", {}),
        ("reduce_scatter", {"ring_step": 0, "chunk": 0}),
        ("reduce_scatter", {"ring_step": last, "chunk": 1}),
        ("allgather", {"ring_step": 0, "chunk": 0}),
        ("allgather", {"ring_step": last, "chunk": 2}),
        ("commit", {}),
    ]


CASES = [(n, victim, point, where) for n in (2, 3, 4) for victim in sorted({0, n - 1, 1})
         for point, where in points(n)]
# Keep the job count sensible: every point at 4 ranks, a sample at 2 and 3.
CASES = [c for c in CASES if c[0] == 4 or c[2] in ("reduce_scatter", "allgather")]


def spec(victim, point, where):
    parts = [f"rank={victim}", f"point={point}", "step=1"] + [f"{k}={v}" for k, v in where.items()]
    return ",".join(parts)


@pytest.mark.fault
@pytest.mark.parametrize("n,victim,point,where", CASES,
                         ids=[f"n{c[0]}-kill{c[1]}-{c[2]}-{'-'.join(map(str, c[3].values()))}" for c in CASES])
def test_kill_at_point_leaves_buffers_and_retries(n, victim, point, where):
    dtype, op = ("float32", "sum") if n != 3 else ("int64", "prod")
    job = run_job(JOBS / "allreduce_fault.py", n, COUNT, dtype, op,
                  env={"FTCOMM_FAULT": spec(victim, point, where)}, timeout=90)
    check_killed_step(job, n, victim)


# 5 MiB + 12 bytes of float32: from 2 MiB a ring writes its undo log with streaming stores
BIG_COUNT = (5 << 20) // 4 + 3


@pytest.mark.fault
@pytest.mark.parametrize("n,victim,point,where", [(2, 1, "allgather", {"ring_step": 0, "chunk": 2}),
                                                  (4, 1, "reduce_scatter", {"ring_step": 1, "chunk": 3}),
                                                  (4, 2, "commit", {})],
                         ids=["n2-allgather", "n4-reduce_scatter", "n4-commit"])
def test_kill_on_a_large_buffer_restores_it_from_the_streamed_undo_log(n, victim, point, where):
    """The same for a buffer large enough that its undo log is written with streaming stores:
    every survivor's buffer is bitwise as before the step, and the retry is right. Its 4 KiB
    chunks would be 320 per segment at 4 ranks: the ring caps them at 64 (chunking.h), without
    which a kill mid-ring crashed Open MPI's agreement on a survivor."""
    job = run_job(JOBS / "allreduce_fault.py", n, BIG_COUNT, "float32", "sum",
                  env={"FTCOMM_FAULT": spec(victim, point, where)}, timeout=120)
    check_killed_step(job, n, victim)


def check_killed_step(job, n, victim):
    assert job.returncode == 0, job.describe()
    survivors = [r for r in range(n) if r != victim]
    reports = job.by_rank()
    assert sorted(reports) == survivors, job.describe()
    errors = [rep["error"] for rep in reports.values()]
    assert all(e is not None for e in errors), errors
    assert all(e == errors[0] for e in errors), f"survivors disagree: {errors}"
    assert errors[0]["type"] == "ProcFailedError"
    assert errors[0]["step"] == 1
    assert errors[0]["failed_ranks"] == [victim]
    assert errors[0]["unchanged"] is True
    digests = {rep["digest"] for rep in reports.values()}
    assert len(digests) == 1, "retry results differ between survivors"
    for rep in reports.values():
        assert rep["size"] == n - 1
        assert rep["correct"] is True
        assert rep["replay_noop"] is True
        assert rep["last_committed"] == 1


RS_COUNT = 12 * 2003  # divisible by 4 and 3 ranks; several 4096-byte chunks per segment
RS_CASES = [(4, 1, "before", {}), (4, 3, "reduce_scatter", {"ring_step": 0, "chunk": 0}),
            (4, 0, "reduce_scatter", {"ring_step": 2, "chunk": 1}), (4, 2, "commit", {}),
            (3, 2, "reduce_scatter", {"ring_step": 1, "chunk": 0})]


@pytest.mark.fault
@pytest.mark.parametrize("n,victim,point,where", RS_CASES,
                         ids=[f"n{c[0]}-kill{c[1]}-{c[2]}-{'-'.join(map(str, c[3].values()))}" for c in RS_CASES])
def test_reduce_scatter_kill_leaves_input_and_output(n, victim, point, where):
    """The reduce-scatter's commit: a kill anywhere before the agreement leaves every survivor's
    input and output bitwise as they were, the same error everywhere; the retry over the survivors
    equals the reference."""
    dtype, op = ("float32", "sum") if n == 4 else ("int64", "max")
    job = run_job(JOBS / "reduce_scatter_fault.py", n, RS_COUNT, dtype, op,
                  env={"FTCOMM_FAULT": spec(victim, point, where)}, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == [r for r in range(n) if r != victim], job.describe()
    errors = [rep["error"] for rep in reports.values()]
    assert all(e == errors[0] for e in errors), f"survivors disagree: {errors}"
    assert errors[0] == {"type": "ProcFailedError", "step": 1, "failed_ranks": [victim], "unchanged": True}
    for rep in reports.values():
        assert rep["size"] == n - 1
        assert rep["correct"] is True
        assert rep["input_kept"] is True
        assert rep["last_committed"] == 1
