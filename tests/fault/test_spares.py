"""Recovery back to the full world size with spare ranks (and respawn, where it works).

4 active ranks plus spares under ftcomm-run --spares S. After a kill the world is back to 4, every
survivor keeps its rank, and the state on every rank, the promoted spare included, is bitwise the
state of the last committed step; a run with kills ends bitwise where a failure-free run ends."""
import re
from collections import defaultdict

import pytest

from harness import JOBS, run_job

pytestmark = pytest.mark.fault
TIMEOUT = 150
RECOVERED = 3  # --recovered-exit-code: the launcher must tell a recovered run from a clean one


def _train(fault, spares, *args, policy="spares"):
    env = {"FTCOMM_TIMEOUT": "30"}
    if fault:
        env["FTCOMM_FAULT"] = fault
    return run_job(JOBS / "spares_train.py", 4, "--policy", policy, *args, env=env, timeout=TIMEOUT,
                   launcher_args=("--spares", str(spares), "--recovered-exit-code", str(RECOVERED)))


@pytest.fixture(scope="module")
def reference():
    """Final state digest and per-step digests of a failure-free run (spares idle, released)."""
    res = _train(None, 1)
    assert res.returncode == 0, res.describe()
    done = res.by_rank(event="done")
    assert sorted(done) == [0, 1, 2, 3], res.describe()  # the spare (world rank 4) never reports
    finals = {d["final"] for d in done.values()}
    assert len(finals) == 1
    return {"final": finals.pop(), "commits": _commits(res)}


def _commits(res) -> dict:
    """(step, rank) -> the commit report of that rank at that step (one per (step, rank))."""
    out = {}
    for r in res.reports:
        if r["event"] == "commit":
            assert (r["step"], r["rank"]) not in out, f"step {r['step']} committed twice on rank {r['rank']}"
            out[(r["step"], r["rank"])] = r
    return out


def _same_commits(commits, reference) -> None:
    """The committed steps are those of the failure-free run (none lost, none applied twice) and
    each rank's state, RNG and data position after each of them are bitwise the same."""
    assert sorted(commits) == sorted(reference["commits"])
    for key, ref in reference["commits"].items():
        got = commits[key]
        assert (got["state"], got["rng"], got["sampler"]) == (ref["state"], ref["rng"], ref["sampler"]), key


def _check_recovery(res, reference, victims_by_step):
    """Every recovery: survivors bitwise equal to their snapshot, newcomers equal to the
    survivors and to the replaced rank's committed RNG and data position; world back to 4;
    the committed steps exactly those of the reference, bitwise."""
    commits = _commits(res)
    events = [r for r in res.reports if r["event"] in ("recovered", "joined")]
    by_step = defaultdict(list)
    for e in events:
        by_step[e["step"]].append(e)
    assert sorted(by_step) == sorted(victims_by_step), (sorted(by_step), res.describe())
    for step, group in by_step.items():
        assert sorted(e["rank"] for e in group) == [0, 1, 2, 3] and {e["size"] for e in group} == {4}
        assert len({e["state"] for e in group}) == 1 and len({e["params"] for e in group}) == 1
        for e in group:
            if e["event"] == "recovered":
                assert not e["promoted"] and e["equal"] == {"state": True, "params": True, "rng": True,
                                                            "sampler": True}, e
            else:
                assert e["promoted"] and e["world_rank"] >= 4
                replaced = commits[(step, e["rank"])]  # the dead rank's report of the last commit
                assert replaced["world_rank"] == victims_by_step[step]
                assert (e["state"], e["params"], e["rng"], e["sampler"]) == (
                    replaced["state"], replaced["params"], replaced["rng"], replaced["sampler"])
    _same_commits(commits, reference)
    done = res.by_rank(event="done")
    assert {d["size"] for d in done.values()} == {4} and sorted(d["rank"] for d in done.values()) == [0, 1, 2, 3]
    assert {d["final"] for d in done.values()} == {reference["final"]}
    return done


def test_spare_takes_the_killed_ranks_place(reference):
    res = _train("rank=2,point=train_step,step=4", 1)
    assert res.returncode == RECOVERED, res.describe()
    done = _check_recovery(res, reference, {3: 2})
    assert sorted(done) == [0, 1, 3, 4] and done[4]["rank"] == 2 and done[4]["promoted"]


def test_two_failures_in_a_row_promoted_spare_dies_too(reference):
    # Rank 2 dies at step 4 (spare 4 takes its place), then that spare dies at step 7 (spare 5).
    res = _train("rank=2,point=train_step,step=4;rank=4,point=train_step,step=7", 2)
    assert res.returncode == RECOVERED, res.describe()
    done = _check_recovery(res, reference, {3: 2, 6: 4})
    assert sorted(done) == [0, 1, 3, 5] and done[5]["rank"] == 2


def test_failure_during_the_spares_join_is_survived(reference):
    # Rank 1 dies at step 4; during the rebuild that brings spare 4 in, rank 3 dies too (a failure
    # during recovery): the round starts over and spare 5 takes rank 3's place.
    res = _train("rank=1,point=train_step,step=4;rank=3,point=rebuild,step=3", 2)
    assert res.returncode == RECOVERED, res.describe()
    done = res.by_rank(event="done")
    assert sorted(done) == [0, 2, 4, 5], res.describe()
    assert [w for w, d in sorted(done.items()) if d["promoted"]] == [4, 5]
    assert {d["size"] for d in done.values()} == {4} and {d["final"] for d in done.values()} == {reference["final"]}
    _same_commits(_commits(res), reference)


def test_spares_exhausted_falls_back_to_shrink_logged(reference):
    res = _train("rank=2,point=train_step,step=4;rank=1,point=train_step,step=7", 1)
    assert res.returncode == RECOVERED, res.describe()
    assert "spares exhausted; shrinking instead" in res.stderr
    fallback = [r for r in res.reports if r["event"] == "recovered" and r["step"] == 6]
    assert sorted(r["rank"] for r in fallback) == [0, 1, 2] and all(r["size"] == 3 for r in fallback)
    assert all(r["policy"] == "shrink" and r["fallback"] == "spares exhausted" for r in fallback)
    assert all(r["equal"] == {"state": True, "params": True, "rng": True, "sampler": True} for r in fallback)
    done = res.by_rank(event="done")
    assert sorted(done) == [0, 3, 4] and {d["size"] for d in done.values()} == {3}


def test_state_lost_with_a_newcomer_is_uniform():
    """Rank 1 and its only buddy (rank 2) die together: the spare takes rank 1's place, and the
    rebuild finds shard 1 lost. Every remaining rank, the newcomer included, gets StateLostError
    (no disk fallback with newcomers), and the job ends by itself."""
    res = _train("rank=1,point=train_step,step=4;rank=2,point=train_step,step=4", 1)
    assert res.returncode == RECOVERED, res.describe()  # every remaining rank ended normally
    lost = res.by_rank(event="state_lost")
    assert sorted(lost) == [0, 3, 4], res.describe()
    assert all(r["lost_shards"] == [1] and r["step"] == 3 for r in lost.values())
    assert lost[4]["newcomer"] and not lost[0]["newcomer"]


@pytest.mark.parametrize("point", ["before", "reduce_scatter,ring_step=1,chunk=0", "commit"])
def test_allreduce_keeps_ranks_and_size(point):
    """Communicator level: a committed allreduce sums (r + 1) * step over ranks r; after the kill
    the sum of a full world (10 * step) comes back at once, the newcomer in rank 2's place."""
    res = run_job(JOBS / "spares_allreduce.py", 4, "spares", 6,
                  env={"FTCOMM_FAULT": f"rank=2,point={point},step=3,kind=kill", "FTCOMM_TIMEOUT": "30"},
                  launcher_args=("--spares", "1"), timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    reports = res.by_rank()
    assert sorted(reports) == [0, 1, 3, 4], res.describe()
    for w, r in reports.items():
        assert r["size"] == 4 and r["world_ranks"] == [0, 1, 4, 3]
        assert r["rank"] == (2 if w == 4 else w) and r["promoted"] == (w == 4)
        first = 3 if w == 4 else 0
        assert r["results"] == {str(s): 10.0 * s for s in range(first, 7)}


@pytest.mark.parametrize("policy, logged", [
    ("spares", "recover(policy='spares'): no spare pool (start the job with ftcomm-run --spares S); "
               "shrinking instead"),
    ("respawn", "recover(policy='respawn'): MPI_Comm_spawn is unreliable in Open MPI 5.0.x"),
])
def test_policy_that_cannot_bring_newcomers_shrinks_logged(policy, logged):
    """Spares without a pool (no --spares), respawn on Open MPI 5.0.x: shrink, the reason logged
    and in ``recovery["fallback"]``, the retried sums those of the survivors."""
    res = run_job(JOBS / "spares_allreduce.py", 4, policy, 4,
                  env={"FTCOMM_FAULT": "rank=1,point=before,step=2,kind=kill", "FTCOMM_TIMEOUT": "30"},
                  timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    assert logged in res.stderr
    reports = res.by_rank()
    assert sorted(reports) == [0, 2, 3]
    # ranks 0, 2, 3 contribute (r + 1) * step with new ranks 0, 1, 2: 6 * step after the shrink
    assert all(r["results"]["4"] == 24.0 and r["size"] == 3 for r in reports.values())
    reason = logged.split("): ")[1].removesuffix("; shrinking instead")
    assert all(r["recoveries"][0]["policy"] == "shrink" and reason in r["recoveries"][0]["fallback"]
               for r in reports.values())


def test_forced_respawn_recovers_right_but_its_end_is_unreliable():
    """The evidence behind the respawn fallback (docs/SPARES.md). Forced on Open MPI 5.0.11,
    respawn brings the world back to 4 with the right sums; what fails, in about one run in four,
    is the end: MPI_Finalize across the spawned job hangs (ftcomm's watchdog then exits the rank)
    or crashes, and the launcher reports an abnormal end."""
    res = run_job(JOBS / "spares_allreduce.py", 4, "respawn", 4,
                  env={"FTCOMM_FAULT": "rank=1,point=before,step=2,kind=kill", "FTCOMM_TIMEOUT": "20",
                       "FTCOMM_FINALIZE_TIMEOUT": "10", "FTCOMM_RESPAWN": "force"}, timeout=90)
    reports = [r for r in res.reports if "results" in r]
    assert len(reports) == 4, res.describe()
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    for r in reports:
        assert r["size"] == 4 and r["results"]["4"] == 40.0 and r["promoted"] == (r["rank"] == 1)
        assert r["recoveries"] == [] if r["promoted"] else r["recoveries"][0]["policy"] == "respawn"
    known_end = re.search(r"MPI_Finalize did not finish in time|Segmentation fault", res.stdout + res.stderr)
    assert res.returncode == 0 or known_end, res.describe()


def test_twenty_kill_and_replace_cycles_leak_nothing():
    """Rank 3's place is killed 20 times (world ranks 3, 4, ..., 22: each promoted spare dies in
    turn); the survivors' RSS and open file descriptors after the last cycle stay within 10% of
    their level after the first, and every rebuilt state is bitwise the committed one."""
    kills = ";".join(f"rank={3 + i},point=train_step,step={2 + i}" for i in range(20))
    res = run_job(JOBS / "spares_train.py", 4, "--policy", "spares", "--steps", "24", "--resources",
                  env={"FTCOMM_FAULT": kills, "FTCOMM_TIMEOUT": "60"}, timeout=600,
                  launcher_args=("--spares", "20"))
    assert res.returncode == 0, res.describe()
    done = res.by_rank(event="done")
    assert sorted(done) == [0, 1, 2, 23] and {d["size"] for d in done.values()} == {4}, res.describe()
    for w in (0, 1, 2):
        cycles = [r for r in res.reports if r["event"] == "recovered" and r["world_rank"] == w]
        assert len(cycles) == 20 and all(all(r["equal"].values()) for r in cycles)
        first, last = cycles[0], cycles[-1]
        assert last["rss"] <= 1.10 * first["rss"], (w, first["rss"], last["rss"])
        assert last["fds"] <= 1.10 * first["fds"], (w, first["fds"], last["fds"])


def test_an_idle_spare_sleeps():
    """An idle spare polls with sleeps (up to 2 ms): it must not spin a core while it waits."""
    res = run_job(JOBS / "spares_idle.py", 2, launcher_args=("--spares", "1"), timeout=TIMEOUT)
    assert res.returncode == 0, res.describe()
    (rep,) = [r for r in res.reports if "cpu_fraction" in r]
    assert rep["cpu_fraction"] < 0.1, rep


def test_a_stuck_idle_spare_does_not_keep_the_job_from_ending():
    """A spare stopped (SIGSTOP) while idle cannot take its release: the actives fence it at the
    end, and the job ends by itself, well before the launcher's timeout."""
    res = run_job(JOBS / "spares_idle.py", 2, "stop", launcher_args=("--spares", "1"), timeout=60)
    assert res.returncode == 0, res.describe()
    assert "fencing world rank 2" in res.stderr, res.describe()
