"""Point-to-point on the ftcomm torch backend with a rank lost (tests/jobs/torch_p2p_fault.py, 4
ranks): a rank killed or stopped (fenced) instead of sending in a ring exchange of isend/irecv.
Its peers' operations raise ProcFailedError within the fence timeout (the others' complete with
the right values), a receive from any source that only the dead rank would have matched raises
instead of waiting, and the group goes on: its next all_reduce raises once (rebuilt over the
survivors) and the retry and a last ring exchange give the members' values. And a receive that no
live rank matches: CollectiveTimeoutError at the group's timeout, the peer not fenced; a send that
timed out is still delivered to a receive posted later."""
import pytest

from harness import JOBS, run_job

pytest.importorskip("torch")

VICTIM = 2


@pytest.mark.fault
@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_rank_lost_in_point_to_point(how):
    n = 4
    job = run_job(JOBS / "torch_p2p_fault.py", n, "--how", how, "--anysource",
                  env={"FTCOMM_FENCE_TIMEOUT": "5", "FTCOMM_TIMEOUT": "30"}, timeout=110)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    for world_rank, rep in finals.items():
        rounds = rep["rounds"]
        assert all(r["errors"] == [] and r["right"] for r in rounds[:2]), rep  # before the loss
        # world rank 1 sends to the victim, world rank 3 receives from it: both fail, at once when
        # it was killed, after the fence timeout when stopped; never at the 30 s deadline. Their
        # other operation (with world rank 0) completes.
        if world_rank in (1, 3):
            assert all(r["errors"] == ["ProcFailedError"] for r in rounds[2:]), rep
            assert rounds[2]["s"] < 20, rep
        else:
            assert all(r["errors"] == [] and r["right"] for r in rounds), rep
        assert rep["after"] == {"first": "ProcFailedError", "sum": 1.0 + 2.0 + 4.0, "ring": [[], True]}, rep
        assert rep["size"] == n - 1
    anysource = finals[0]["anysource"]
    assert anysource["error"] == "ProcFailedError" and anysource["failed"] == [VICTIM], anysource
    assert anysource["s"] < 20, anysource


@pytest.mark.fault
@pytest.mark.timeout(100)
def test_a_receive_nobody_matches_times_out_without_fencing():
    job = run_job(JOBS / "torch_p2p_fault.py", 2, "--unmatched", env={"FTCOMM_TIMEOUT": "3"}, timeout=60)
    assert job.returncode == 0, job.describe()
    reps = job.by_rank(kind="unmatched")
    assert sorted(reps) == [0, 1], job.describe()
    for world_rank, rep in reps.items():
        assert rep["error"] == {"type": "CollectiveTimeoutError",
                                "text": f"recv on world rank {world_rank}: not matched by rank {1 - world_rank} "
                                        f"(world rank {1 - world_rank}) within 3 s"}, rep
        assert 3 <= rep["s"] < 20 and rep["ring"] == [[], True], rep
    # a send that timed out is still delivered (Open MPI cannot cancel it), and says so
    assert reps[0]["late_send"] == {"error": {
        "type": "CollectiveTimeoutError",
        "text": "send on world rank 0: not matched by rank 1 (world rank 1) within 3 s; Open MPI cannot cancel a "
                "send: it stays posted, and a matching receive posted later still gets the message"}}, reps[0]
    assert reps[1]["late_send"] == {"equal": True}, reps[1]
    assert "fencing" not in job.stderr
