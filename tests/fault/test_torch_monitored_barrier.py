"""``ftcomm.torch.monitored_barrier`` (tests/jobs/torch_monitored_barrier.py, 3 ranks): a rank late
within the timeout is waited for; one late past it is named on rank 0 in gloo's words, the others
raise, nobody is fenced, and the next monitored barrier passes; a rank killed or stopped in one is
named on rank 0 as failed (a stopped one after the fence timeout), and the survivors' next
all_reduce recovers the group."""
import pytest

from harness import JOBS, run_job

pytest.importorskip("torch")

FENCE_S = 4


@pytest.mark.fault
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_monitored_barrier_names_late_and_lost_ranks(fault):
    job = run_job(JOBS / "torch_monitored_barrier.py", 3, "--fault", fault,
                  env={"FTCOMM_FENCE_TIMEOUT": str(FENCE_S)}, timeout=140)
    assert job.returncode == 0, job.describe()
    phases = {}
    for rep in job.reports:
        if rep["kind"] == "phase":
            phases.setdefault(rep["name"], {})[rep["world_rank"]] = rep
    reached, late, after, lost = (phases.get(name, {}) for name in ("reached", "late", "after", "lost"))
    assert sorted(reached) == sorted(late) == sorted(after) == [0, 1, 2], job.describe()
    assert all(rep["error"] is None for rep in reached.values()), reached
    assert reached[0]["s"] >= 0.9, reached  # rank 0 waited for the late rank
    assert late[0]["error"]["type"] == "CollectiveTimeoutError", late
    assert "Rank 2 failed to pass monitoredBarrier in 2000 ms (world rank(s) [2])" in late[0]["error"]["text"], late
    for rank in (1, 2):
        assert late[rank]["error"]["type"] == "CollectiveTimeoutError", late
        assert "rank 0 (world rank 0) did not answer within 2 s" in late[rank]["error"]["text"], late
    assert all(rep["error"] is None for rep in after.values()), after
    assert sorted(lost) == [0, 1], job.describe()
    assert lost[0]["error"]["type"] == "ProcFailedError" and lost[0]["error"]["failed"] == [2], lost
    assert lost[0]["s"] < (2 if fault == "kill" else FENCE_S + 10), lost
    assert lost[1]["error"] is not None and lost[1]["s"] < 30, lost
    finals = job.by_rank(kind="after_loss")
    assert sorted(finals) == [0, 1], job.describe()
    for rep in finals.values():
        assert rep["errors"] == ["ProcFailedError"] and rep["total"] == 2.0 and rep["size"] == 2, rep
