"""Slow is not dead: liveness that holds on busy machines.

Each test runs a 4-rank job (tests/jobs/liveness_cases.py and friends) in which one rank
misbehaves, and checks what every rank saw: who was fenced and who was not, the sums of every
committed step, how long the failed call took against its timeout, and that the errors name the
culprit by world rank and say what it was doing.
"""
import os
import subprocess
import sys
import time

import pytest

from harness import JOBS, run_job

pytestmark = pytest.mark.fault

N = 4
STEPS = 5
FULL = sum(range(1, N + 1))


def expected_sum(step: int, members) -> float:
    return float(sum(w + 1 for w in members) * (step + 1))


def commits(res) -> dict:
    """(world rank, step) -> the committed report."""
    return {(r["world_rank"], r["step"]): r for r in res.reports if r["kind"] == "commit"}


def errors(res) -> dict:
    """world rank -> its first error report."""
    out = {}
    for r in res.reports:
        if r["kind"] == "error":
            out.setdefault(r["world_rank"], r)
    return out


class CpuHogs:
    """One busy-looping process per core, for the life of the block: the machine is starved."""

    def __enter__(self):
        code = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 2)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(240)
def test_busy_rank_is_not_fenced_on_a_starved_machine():
    """Rank 1 computes pure Python (the GIL held, no ftcomm call) for 3x the fence timeout
    between two steps, while a CPU hog runs on every core: its process heartbeat keeps it from
    being fenced, the others wait for it (it is within the collective's timeout), and every step
    commits the full sum on every rank."""
    env = {"FTCOMM_TIMEOUT": "60", "FTCOMM_FENCE_TIMEOUT": "2"}
    with CpuHogs():
        res = run_job(JOBS / "liveness_cases.py", N, "busy", 1, 3, 6.0, env=env, timeout=200)
    assert res.returncode == 0, res.describe()
    assert "fencing" not in res.stderr, res.describe()
    got = commits(res)
    for w in range(N):
        for step in range(STEPS):
            assert got[(w, step)]["sum"] == expected_sum(step, range(N)), (w, step)
    waited = [got[(w, 3)]["seconds"] for w in range(N) if w != 1]
    assert min(waited) >= 5.0, waited  # they did wait for the busy rank


@pytest.mark.timeout(120)
def test_stopped_rank_is_fenced_and_every_call_returns_within_its_timeout():
    """Rank 2 SIGSTOPs itself before step 3: it is fenced, every survivor's allreduce of step 3
    raises the same ProcFailedError naming world rank 2 within timeout + 2 s, and the survivors
    redo the step among themselves."""
    res = run_job(JOBS / "liveness_cases.py", N, "stop", 2, 3, env={"FTCOMM_TIMEOUT": "5"}, timeout=90)
    assert res.returncode == 0, res.describe()
    errs = errors(res)
    assert sorted(errs) == [0, 1, 3], res.describe()
    for err in errs.values():
        assert err["type"] == "ProcFailedError" and err["failed_world"] == [2] and err["step"] == 3
        assert err["seconds"] <= 5 + 2, err
        assert "world rank 2" in err["message"] and "fenced" in err["message"], err
    assert len({e["message"] for e in errs.values()}) == 1
    got = commits(res)
    for w in (0, 1, 3):
        for step in range(3, STEPS):
            assert got[(w, step)]["sum"] == expected_sum(step, (0, 1, 3))


@pytest.mark.timeout(120)
def test_late_rank_is_fenced_by_default_and_named():
    """Rank 1 sleeps 20 s before step 3, past the 4 s timeout (FTCOMM_LATE_RANK=fence, the
    default): the others fence it at their deadline and raise a ProcFailedError that names it
    and what it was doing, then go on without it."""
    res = run_job(JOBS / "liveness_cases.py", N, "late", 1, 3, 20.0, env={"FTCOMM_TIMEOUT": "4"}, timeout=90)
    assert res.returncode == 0, res.describe()
    errs = errors(res)
    assert sorted(errs) == [0, 2, 3], res.describe()
    for err in errs.values():
        assert err["type"] == "ProcFailedError" and err["failed_world"] == [1], err
        assert 4 <= err["seconds"] <= 4 + 2, err
        assert "world rank 1" in err["message"] and "outside ftcomm for" in err["message"], err
        assert "last in allreduce step 2" in err["message"], err
    got = commits(res)
    assert all(got[(w, STEPS - 1)]["sum"] == expected_sum(STEPS - 1, (0, 2, 3)) for w in (0, 2, 3))


def _rank_1_late_at_step_3(env: dict):
    """Rank 1 sleeps 8 s before step 3 under a 4 s timeout (``env`` says whose): ranks 0, 2 and 3
    raise CollectiveTimeoutError at step 3 within 4 + 2 s. Returns (the job, their errors)."""
    res = run_job(JOBS / "liveness_cases.py", N, "late", 1, 3, 8.0, env=env, timeout=90)
    waiting = {w: e for w, e in errors(res).items() if w != 1}
    assert sorted(waiting) == [0, 2, 3], res.describe()
    for err in waiting.values():
        assert err["type"] == "CollectiveTimeoutError" and err["step"] == 3, err
        assert err["seconds"] <= 4 + 2, err
    return res, waiting


@pytest.mark.timeout(120)
def test_late_rank_is_only_named_under_the_raise_policy():
    """FTCOMM_LATE_RANK=raise: nobody is fenced; the ranks that waited raise
    CollectiveTimeoutError naming the late rank, within timeout + 2 s."""
    res, waiting = _rank_1_late_at_step_3({"FTCOMM_TIMEOUT": "4", "FTCOMM_LATE_RANK": "raise"})
    assert "fencing" not in res.stderr, res.describe()
    for err in waiting.values():
        assert "world rank 1" in err["message"] and "(late)" in err["message"], err


@pytest.mark.timeout(120)
def test_the_communicators_own_timeout_bounds_its_calls():
    """``Communicator(timeout=4)`` with FTCOMM_TIMEOUT at its default (600 s): the ranks that
    wait for a late rank raise CollectiveTimeoutError within 4 + 2 s."""
    _rank_1_late_at_step_3({"COMM_TIMEOUT": "4", "FTCOMM_LATE_RANK": "raise", "FTCOMM_TIMEOUT": "600"})


@pytest.mark.timeout(120)
def test_forgotten_collective_names_the_missing_rank():
    """Rank 3 skips one allreduce, so the others call one more than it does and wait at the end
    while it has left: every waiting rank raises CollectiveTimeoutError within timeout + 2 s,
    naming world rank 3; nobody is fenced."""
    res = run_job(JOBS / "liveness_cases.py", N, "skip", 3, 2, env={"FTCOMM_TIMEOUT": "4"}, timeout=90)
    errs = errors(res)
    assert sorted(errs) == [0, 1, 2], res.describe()
    for err in errs.values():
        assert err["type"] == "CollectiveTimeoutError", err
        assert err["seconds"] <= 4 + 2, err
        assert "world rank 3 has ended its program" in err["message"], err
    assert "fencing" not in res.stderr


@pytest.mark.timeout(300)
def test_two_communicators_over_the_same_ranks_recover_every_time():
    """A and B over the same ranks, allreduces alternating A, B; a rank killed inside one of A's.
    Each communicator recovers at its own next call, whatever each survivor saw first (B already
    revoked at entry, or failing inside): every run, every survivor commits every step of both
    with the survivors' sums, and the job ends by itself."""
    runs = int(os.environ.get("FTCOMM_TEST_REPEAT", "10"))
    for run in range(runs):
        point = ("reduce_scatter", "allgather")[run % 2]
        res = run_job(JOBS / "two_comms.py", N, 6, timeout=90,
                      env={"FTCOMM_TIMEOUT": "20", "FTCOMM_FAULT": f"rank=2,point={point},step=3,ring_step=0,chunk=0"})
        assert res.returncode == 0, f"run {run}: {res.describe()}"
        done = res.by_rank(kind="done")
        assert sorted(done) == [0, 1, 3] and all(d["sizes"] == {"A": 3, "B": 3} for d in done.values()), run
        for r in res.reports:
            if r["kind"] == "commit":
                scale = 1 if r["comm"] == "A" else 10
                assert r["sum"] == scale * expected_sum(r["step"], r["members"]), (run, r)
        steps = {(r["world_rank"], r["comm"]) for r in res.reports if r["kind"] == "commit" and r["step"] == 5}
        assert len(steps) == 6, (run, steps)


@pytest.mark.timeout(600)
def test_ddp_with_a_subgroup_recovers_both_groups():
    """DDP on the default group plus a dist.new_group of every rank used each step: a rank
    killed in a gradient bucket; both groups recover, every applied step's subgroup sum equals
    the number of ranks that took it, and the survivors end with identical parameters."""
    runs = int(os.environ.get("FTCOMM_TEST_REPEAT", "3"))
    for run in range(runs):
        res = run_job(JOBS / "torch_subgroup_kill.py", N, timeout=150,
                      env={"FTCOMM_TIMEOUT": "20", "FTCOMM_FAULT": "rank=2,point=reduce_scatter,step=5,kind=kill"})
        assert res.returncode == 0, f"run {run}: {res.describe()}"
        finals = res.by_rank(kind="final")
        assert sorted(finals) == [0, 1, 3], res.describe()
        assert all(f["size"] == 3 and f["sub_size"] == 3 for f in finals.values())
        assert len({f["params"] for f in finals.values()}) == 1
        steps = [r for r in res.reports if r["kind"] == "step"]
        assert steps and all(r["ranks"] == r["size"] == r["sub_size"] for r in steps), run


@pytest.mark.timeout(300)
def test_recovered_jobs_end_without_a_finalize_stall():
    """Jobs that lost a rank mid-exchange (replication), mid-allgather and mid-allreduce end by
    themselves, every survivor finalizing MPI in time (no 'did not finish in time' fallback)."""
    cases = [("matrix_train.py", "rank=2,point=replicate,step=4,kind=kill", ()),
             ("matrix_train.py", "rank=1,point=shard_update,step=3,kind=kill", ()),
             ("two_comms.py", "rank=2,point=allgather,step=3,ring_step=0,chunk=0", (6,))]
    repeat = int(os.environ.get("FTCOMM_TEST_REPEAT", "2"))
    for script, fault, args in cases * repeat:
        t0 = time.monotonic()
        res = run_job(JOBS / script, N, *args, env={"FTCOMM_TIMEOUT": "10", "FTCOMM_FAULT": fault}, timeout=120)
        wall = time.monotonic() - t0
        assert res.returncode == 0, res.describe()
        assert "did not finish in time" not in res.stderr, res.describe()
        assert wall < 60, (script, fault, wall)


@pytest.mark.timeout(300)
def test_memory_stays_flat_over_500_recoveries():
    """500 revoke/recover cycles with an allreduce on each new communicator: every sum right,
    and resident memory after the last cycle within 5% of its value after 50 (the communicators
    left behind by recoveries are freed)."""
    res = run_job(JOBS / "recover_cycles.py", N, 500, 50, env={"FTCOMM_TIMEOUT": "30"}, timeout=240)
    assert res.returncode == 0, res.describe()
    rss = res.by_rank(kind="rss")
    assert sorted(rss) == list(range(N)), res.describe()
    for r in rss.values():
        assert r["sums_ok"] and r["size"] == N
        assert r["end"] <= 1.05 * r["warm"], r


@pytest.mark.timeout(120)
def test_a_rank_waiting_in_another_ftcomm_call_is_not_fenced():
    """Rank 0's exchange times out waiting for a late rank 1 and for rank 2, which sent its part
    and waits in a min/max round: rank 1 is fenced; rank 2 is not (it is inside ftcomm, waiting
    too), stays alive, and its own wait ends with the failure of rank 1 (or the revoke after it)."""
    res = run_job(JOBS / "liveness_other_call.py", N, 20.0, env={"FTCOMM_TIMEOUT": "4"}, timeout=90)
    assert "fencing world rank 1" in res.stderr, res.describe()
    assert "fencing world rank 2" not in res.stderr and "fencing world rank 3" not in res.stderr, res.describe()
    # Each wait's outcome is local: the failure of rank 1, or the revoke of a rank that saw it first.
    errs = errors(res)
    assert sorted(errs) == [0, 2, 3], res.describe()
    for err in errs.values():
        assert err["type"] in ("ProcFailedError", "RevokedError") and set(err["failed_world"]) <= {1}, err
    assert 1 not in errs and 1 not in {r["world_rank"] for r in res.reports}, res.describe()
