"""ULFM kill scenarios at 4 ranks: every survivor sees ProcFailedError or RevokedError
within 5 s, shrink gives 4 - k consecutive ranks, agree returns the AND of the survivors' flags,
and a collective on the shrunk communicator is right."""
import os

import pytest

from harness import JOBS, run_job

REPEAT = int(os.environ.get("FTCOMM_TEST_REPEAT", "1"))


@pytest.mark.fault
@pytest.mark.parametrize("repeat", range(REPEAT))
@pytest.mark.parametrize("victims", [[2], [0], [1, 3]], ids=["kill-2", "kill-0", "kill-1-and-3"])
def test_survivors_detect_shrink_agree_and_reduce(victims, repeat):
    n = 4
    job = run_job(JOBS / "ulfm_kill.py", n, ",".join(map(str, victims)), timeout=90)
    assert job.returncode == 0, job.describe()
    survivors = [r for r in range(n) if r not in victims]
    reports = job.by_rank()
    assert sorted(reports) == survivors, job.describe()
    k = len(victims)
    expected_flag = 0xFF
    for new_rank in range(n - k):
        expected_flag &= ~(1 << new_rank)
    expected_sum = sum(r + 1 for r in survivors)
    for world_rank, rep in reports.items():
        assert rep["error"] in ("ProcFailedError", "RevokedError"), rep
        assert rep["detect_s"] < 5.0, rep
        assert rep["size"] == n - k
        assert rep["ranks"] == list(range(n - k))
        assert rep["rank"] == survivors.index(world_rank)  # consecutive, old order kept
        assert rep["agreed"] == expected_flag
        assert rep["sum"] == expected_sum
        assert rep["old_to_new"] == [survivors.index(r) if r in survivors else -1 for r in range(n)]
