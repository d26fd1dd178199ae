"""Uncommitted allreduces and the caller's agreement (core/communicator.py ``commit=False``; the
torch backend's step-level commit is exercised by test_torch_ddp_faults.py): results equal to the
reference, step ids recorded only by ``commit_uncommitted``, bad input uniform on every rank, and a
kill inside one of three uncommitted allreduces caught by the one agreement after them on every
survivor, whatever each survivor's own outcome."""
import pytest

from harness import JOBS, run_job

COUNT = 3 * 4001  # several 4096-byte chunks per segment at 3 and 4 ranks


@pytest.mark.fault
@pytest.mark.timeout(120)
def test_uncommitted_results_step_ids_and_bad_input():
    n = 3
    job = run_job(JOBS / "allreduce_uncommitted.py", n, "clean", COUNT, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["error"] is None and rep["exact"] is True, rep
        assert rep["steps"] == [1, 2, 3], rep          # after the committed step 0, one id each
        assert rep["ledger_before"] == 0, rep           # nothing recorded before the agreement
        assert rep["agreed"] == 1 and rep["committed"] == 3, rep
        assert "needs a committed step" in rep["bad"]["guard"], rep
        assert "commit off" in rep["bad"]["mixed"] and "commit on" in rep["bad"]["mixed"], rep
        assert rep["unchanged"] is True and rep["last"] == 3, rep
        assert rep["voided"] == [4, 5] and rep["redo"] == 4, rep  # a voided step's redo keeps its ids
    assert len({rep["bad"]["mixed"] for rep in reports.values()}) == 1, "the error differs between ranks"


KILLS = [(4, 1, "reduce_scatter", "ring_step=0,chunk=0"), (4, 3, "allgather", "ring_step=2,chunk=1"),
         (4, 0, "before", ""), (3, 2, "allgather", "ring_step=0,chunk=0")]


@pytest.mark.fault
@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,victim,point,where", KILLS, ids=[f"n{k[0]}-kill{k[1]}-{k[2]}" for k in KILLS])
def test_kill_in_an_uncommitted_allreduce_fails_the_agreement_everywhere(n, victim, point, where):
    spec = ",".join(x for x in (f"rank={victim}", f"point={point}", "step=2", where) if x)
    job = run_job(JOBS / "allreduce_uncommitted.py", n, "kill", COUNT, env={"FTCOMM_FAULT": spec}, timeout=120)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    survivors = [r for r in range(n) if r != victim]
    assert sorted(reports) == survivors, job.describe()
    for rep in reports.values():
        assert rep["agreed"] == 0, rep                  # the same verdict on every survivor
        assert rep["error"] is None or rep["error"]["step"] == 2, rep
        assert rep["agreed_again"] == 1 and rep["size"] == n - 1, rep
        assert rep["exact"] is True and rep["steps"] == [1, 2, 3] and rep["last"] == 3, rep
    assert any(rep["error"] is not None for rep in reports.values()), "no survivor saw the failure"
    assert len({rep["digest"] for rep in reports.values()}) == 1


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_step_agreement_that_times_out_raises_and_recovers_nothing():
    """Under FTCOMM_LATE_RANK=raise a rank late past the deadline is not fenced: the punctual
    ranks' step agreement times out, and, as a committed allreduce's agreement would, it raises
    CollectiveTimeoutError out of optimizer.step() instead of shrinking past a live rank."""
    late = 2
    job = run_job(JOBS / "matrix_ddp.py", 4, "--late-rank", late, "--late-s", 12,
                  env={"FTCOMM_LATE_RANK": "raise", "FTCOMM_TIMEOUT": "4"}, timeout=120)
    errors = {r["world_rank"]: r for r in job.reports if r.get("event") == "error"}
    punctual = [r for r in range(4) if r != late]
    assert set(punctual) <= set(errors), job.describe()
    for rank in punctual:
        assert errors[rank]["it"] == 3 and errors[rank]["type"] == "CollectiveTimeoutError", errors[rank]
        assert "step agreement" in errors[rank]["message"], errors[rank]
    assert "Comm_shrink overran" not in job.stderr, job.describe()
