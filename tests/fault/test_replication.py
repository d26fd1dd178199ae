"""In-memory buddy replicas. Each test runs a 4-rank job (tests/jobs/replication_snapshot.py)
under a hard timeout, kills ranks with FTCOMM_FAULT, and checks that the state rebuilt from owners
and replicas is bitwise equal to the full state gathered at the last committed step."""
import pytest

from harness import JOBS, run_job

pytestmark = pytest.mark.fault
JOB = JOBS / "replication_snapshot.py"
TIMEOUT = 90


def _run(fault, *args):
    return run_job(JOB, 4, *args, env={"FTCOMM_FAULT": fault, "FTCOMM_TIMEOUT": "30"}, timeout=TIMEOUT)


def _check_rebuilt(res, survivors, committed, from_replica, size):
    rebuilt = res.by_rank(event="rebuilt")
    assert sorted(rebuilt) == survivors, res.describe()
    for r in rebuilt.values():
        assert r["step"] == r["snap_step"] == committed, r
        assert all(r["equal"].values()) and r["params_equal"], r
        assert r["from_replica"] == from_replica and r["size"] == size, r
    done = res.by_rank(event="done")
    assert sorted(done) == survivors, res.describe()
    assert {d["step"] for d in done.values()} == {8}
    assert len({d["param_crc"] for d in done.values()}) == 1  # survivors agree on the final model
    return rebuilt


# (victim, fault point, its step id, last committed training step when it dies). Allreduce step
# ids (point "commit") count from 0, so allreduce step 3 is training step 4.
SINGLE = [(0, "train_step", 3, 2), (1, "shard_update", 4, 3), (2, "replicate", 4, 3), (3, "commit", 3, 3)]


@pytest.mark.parametrize("victim,point,step,committed", SINGLE)
def test_k1_single_failure_rebuilds_bitwise_equal_state(victim, point, step, committed):
    res = _run(f"rank={victim},point={point},step={step}", "--replicas", "1")
    assert res.returncode == 0, res.describe()
    survivors = [r for r in range(4) if r != victim]
    rebuilt = _check_rebuilt(res, survivors, committed, [victim], 3)
    # the lost shard came from its buddy, the ring successor
    assert all(r["sources"][str(victim)] == (victim + 1) % 4 for r in rebuilt.values())
    assert all(r["bytes_moved"] > 0 for r in rebuilt.values())


def test_k1_sgd_momentum_state_rebuilt():
    res = _run("rank=1,point=train_step,step=5", "--replicas", "1", "--optimizer", "sgd")
    assert res.returncode == 0, res.describe()
    rebuilt = _check_rebuilt(res, [0, 2, 3], 4, [1], 3)
    assert all(set(r["equal"]) == {"param", "momentum_buffer"} for r in rebuilt.values())


@pytest.mark.parametrize("pair", [(1, 2), (3, 0)])
def test_k2_survives_two_adjacent_failures(pair):
    a, b = pair
    res = _run(f"rank={a},point=train_step,step=4;rank={b},point=train_step,step=4", "--replicas", "2")
    assert res.returncode == 0, res.describe()
    survivors = [r for r in range(4) if r not in pair]
    rebuilt = _check_rebuilt(res, survivors, 3, sorted(pair), 2)
    # both lost shards came from the one survivor after them in the ring
    for r in rebuilt.values():
        assert r["sources"][str(a)] == r["sources"][str(b)] == (b + 1) % 4


def test_k1_rank_and_its_only_buddy_lost_raises_state_lost():
    res = _run("rank=1,point=train_step,step=4;rank=2,point=train_step,step=4", "--replicas", "1")
    lost = res.by_rank(event="state_lost")
    assert sorted(lost) == [0, 3], res.describe()
    assert all(r["lost_shards"] == [1] and r["step"] == 3 and r["size"] == 2 for r in lost.values())
    assert not res.by_rank(event="done")


def test_failure_during_rebuild_restarts_recovery_from_intact_holdings():
    # rank 2 dies in step 4; rank 3 dies while the survivors re-shard (rebuild of step 3)
    res = _run("rank=2,point=train_step,step=4;rank=3,point=rebuild,step=3", "--replicas", "2")
    assert res.returncode == 0, res.describe()
    _check_rebuilt(res, [0, 1], 3, [2, 3], 2)


def test_corrupted_replica_is_detected_and_next_buddy_used():
    # world rank 3's replica of shard 2 goes bad after step 5 commits; rank 2 dies in step 6
    res = _run("rank=2,point=train_step,step=6", "--replicas", "2", "--corrupt", "3", "--corrupt-shard", "2",
               "--corrupt-at", "5")
    assert res.returncode == 0, res.describe()
    rebuilt = _check_rebuilt(res, [0, 1, 3], 5, [2], 3)
    assert all(r["sources"]["2"] == 0 for r in rebuilt.values())  # not rank 3, whose copy is bad


def test_corrupted_only_replica_is_state_lost():
    res = _run("rank=2,point=train_step,step=6", "--replicas", "1", "--corrupt", "3", "--corrupt-shard", "2",
               "--corrupt-at", "5")
    lost = res.by_rank(event="state_lost")
    assert sorted(lost) == [0, 1, 3] and all(r["lost_shards"] == [2] for r in lost.values()), res.describe()
