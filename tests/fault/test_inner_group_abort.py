"""The members of an inner data-plane group give up on it together (ftcomm/torch/group/inner_group.py):
an abort from another thread ends this rank's waiting collective, and another member's abort ends
it through the group's store, even when the transport's connections stay open (NCCL's between the
processes of one host). A new group meets in the old one's store while its rank 0 stays, in a new
store when rank 0 changed."""
import pytest

pytest.importorskip("torch")

from harness import JOBS, run_job  # noqa: E402

pytestmark = pytest.mark.fault


def test_an_abort_ends_the_waiting_collective_on_every_member():
    job = run_job(JOBS / "inner_group_abort.py", 2, timeout=180)
    assert job.returncode == 0, job.describe()
    thread = job.by_rank(kind="phase", phase="thread")
    member = job.by_rank(kind="phase", phase="member")
    assert sorted(thread) == [0, 1] and sorted(member) == [0, 1], job.describe()
    assert all(rep["exact"] for rep in [*thread.values(), *member.values()]), job.describe()
    assert thread[0]["error"] == "ProcFailedError" and "this rank aborted the group" in thread[0]["text"], thread[0]
    assert member[0]["error"] == "ProcFailedError", member[0]
    assert "another member aborted the group" in member[0]["text"] and member[0]["under_deadline"], member[0]
    for rep in member.values():  # a new communicator: a new inner group, exact again, in the same store
        assert rep["again"] and rep["waited"] and rep["groups_made"] == 2 and rep["stores_made"] == 1, rep
    reordered = job.by_rank(kind="phase", phase="new rank 0")
    assert sorted(reordered) == [0, 1], job.describe()
    for rep in reordered.values():  # another rank 0: a new group in a new store
        assert rep["exact"] and rep["groups_made"] == 3 and rep["stores_made"] == 2, rep
