"""Silent data corruption on the gloo data plane (FTCOMM_DATA_PLANE=gloo, FTCOMM_FINGERPRINTS=1):
a bit flipped in one rank's gradient-bucket result after the allreduce (FTCOMM_FAULT
point=result,kind=bitflip, at the bucket's step id) is caught by the fingerprints compared in the
step's agreement, on every rank alike. The step is voided with no shrink and redone from its batch,
so the run ends bitwise as the run without the flip; a rank singled out twice is fenced and the
others recover without it at once (DDP, and ZeRO, whose state is rebuilt bitwise); results that
differ three times in a row raise on every rank.

The DDP job's toy model has one gradient bucket per step, and its bucket allreduces are step ids
0, 1, 2, ... (a voided step's redo keeps its id); step 0 is avoided (a voided first step makes DDP
rebuild its buckets before the redo, so the redo sums in another order)."""
import pytest

from harness import JOBS, run_job

PLANE = {"FTCOMM_DATA_PLANE": "gloo", "FTCOMM_FINGERPRINTS": "1"}


def _ddp(n, flips=""):
    return run_job(JOBS / "torch_ddp_kill.py", n, "--epochs", 1, env={**PLANE, "FTCOMM_FAULT": flips}, timeout=150)


def _flip(rank, *steps):
    return ";".join(f"rank={rank},point=result,step={s},kind=bitflip" for s in steps)


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n,named", [(4, [1]), (2, [0, 1])])
def test_a_rank_whose_bucket_result_differs_voids_the_step_which_is_redone_as_the_clean_run(n, named):
    """4 ranks: world rank 1 is named (the majority holds the other result); 2 ranks: no majority,
    both are named. Nothing shrinks, and the final parameters equal the failure-free run's."""
    clean, flipped = _ddp(n), _ddp(n, _flip(1, 5))
    for job in (clean, flipped):
        assert job.returncode == 0, job.describe()
    clean_finals, finals = clean.by_rank(kind="final"), flipped.by_rank(kind="final")
    assert sorted(finals) == list(range(n)), flipped.describe()
    for rank, rep in finals.items():
        assert clean_finals[rank]["corruptions"] == [] and clean_finals[rank]["redone"] == 0
        assert rep["corruptions"] == [[5, named, "redone"]]
        assert rep["recoveries"] == [] and rep["size"] == n and rep["redone"] == 1
        assert rep["applied"] == clean_finals[rank]["applied"]
        assert rep["params"] == clean_finals[rank]["params"]  # bitwise the run without the flip
    assert f"world ranks {named} (result fingerprints): redone" in flipped.stderr


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_a_rank_whose_result_differs_again_is_fenced_and_the_others_go_on():
    finals = _ddp(4, _flip(2, 5, 8)).survivors_of_a_fencing(2, 4)
    for rep in finals.values():
        assert rep["corruptions"] == [[5, [2], "redone"],
                                      [8, [2], "fenced world ranks [2] (results differed again within 1000 steps)"]]
        assert [r[0] for r in rep["recoveries"]] == [[2]]
    assert len({rep["params"] for rep in finals.values()}) == 1


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_zero_survivors_recover_from_a_fenced_rank_before_the_next_step():
    """The survivors recover in the step's agreement, so that the job's between-step gather of the
    whole ZeRO state (over the communicator) meets no dead member; the state rebuilt after each
    voided step equals the last committed one bitwise."""
    job = run_job(JOBS / "torch_zero.py", 4, "--mode", "kill", "--epochs", 1,
                  env={**PLANE, "FTCOMM_FAULT": _flip(2, 5, 8)}, timeout=150)
    finals = job.survivors_of_a_fencing(2, 4)
    voided = [rep for rep in job.reports if rep.get("kind") == "voided"]
    assert voided and all(rep["equal"] for rep in voided), job.describe()
    for rep in finals.values():
        assert rep["corruptions"] == [[5, [2], "redone"],
                                      [8, [2], "fenced world ranks [2] (results differed again within 1000 steps)"]]
        assert rep["recoveries"] == [[[2], 4, 3, "allreduce"]]
    assert len({(rep["params"], rep["state"]) for rep in finals.values()}) == 1


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_results_that_differ_three_steps_in_a_row_raise_on_every_rank():
    """Two ranks, no majority to fence: the third voided step in a row (the same batch, the same step
    id) raises ResultsDifferError out of optimizer.step() on both."""
    job = _ddp(2, _flip(1, 5, 5, 5))  # the redo of a voided step keeps its step id
    assert job.returncode != 0, job.describe()
    assert job.by_rank(kind="final") == {}
    for rank in (0, 1):
        assert (f"[rank{rank}]: ftcomm.errors.ResultsDifferError: allreduce step 5 voided: silent data corruption: "
                "the ranks' results differ: no majority; world ranks [0, 1] differ; nothing committed; 3 steps in a "
                "row voided so: raised, not redone") in job.stderr, job.describe()
