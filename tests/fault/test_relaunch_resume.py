"""A whole job that dies, brought back by `ftcomm-run --restarts`: 2 made-up nodes x 2 ranks
(`--fake-nodes`), DDP + ZeRO (or DDP with a plain AdamW, every rank holding the whole state) in
a `resilient` loop with a checkpoint every 4 steps (tests/jobs/ckpt_torch.py). At step 14 node n2 crashes (its PRRTE daemon and its ranks are
SIGKILLed): Open MPI 5.0.x ends the whole job, ftcomm-run relaunches it on n1 alone (2 ranks).

- Warm (the default): the relaunch resumes from n1's shared memory at step 13, the last applied
  one (n1 holds its own shards and, by node-aware buddies, the replicas of n2's; with a plain
  optimizer each of n1's ranks holds the whole model and optimizer state).
- Cold (FTCOMM_WARM=0): from the newest complete disk checkpoint, step 12 (the job waits for
  each write, so that one is complete before the crash).

Either way its final parameters and optimizer state are bitwise those of a run stopped at that
step (a checkpoint of it on disk) and restarted by hand at 2 ranks."""
import json

import pytest

from ftcomm.training import checkpoint
from harness import JOBS, run_job

pytestmark = pytest.mark.fault
JOB = JOBS / "ckpt_torch.py"
ENV = {"FTCOMM_TIMEOUT": "30"}


def _done(res) -> dict:
    done = res.by_rank(event="done")
    assert done and len({d["hash"] for d in done.values()}) == 1, res.describe()
    return next(iter(done.values()))


def _crash_and_relaunch(tmp_path, *args, **env):
    hosts = tmp_path / "hosts"
    hosts.write_text("n1 slots=2\nn2 slots=2\n")
    res = run_job(JOB, 4, "--checkpoint-dir", tmp_path / "ckpt", "--kill-node", "n2@14",
                  "--kill-record", tmp_path / "killed", *args, env={**ENV, **env},
                  timeout=240, launcher_args=["--hostfile", hosts, "--fake-nodes", "--ranks-per-node", "2",
                                              "--restarts", "2", "--restart-backoff", "0.5"])
    assert res.returncode == 0, res.describe()
    assert "relaunch 1 of 2" in res.stderr, res.describe()
    kills = {path.name: json.loads(path.read_text()) for path in (tmp_path / "killed").glob("rank*.json")}
    assert sorted(kills) == ["rank2.json", "rank3.json"], res.describe()
    assert all(k["step"] == 14 and k["world_size"] == 4 for k in kills.values()), kills
    resumed = res.by_rank(event="resumed")
    assert sorted(resumed) == [0, 1] and {r["size"] for r in resumed.values()} == {2}, res.describe()
    (step,) = {r["step"] for r in resumed.values()}
    return res, step, next(iter(resumed.values()))


def _same_as_by_hand(tmp_path, step: int, res, resumed: dict, *args) -> None:
    """A run at 4 ranks stopped at ``step`` (its checkpoint written at the end), then restarted at
    2 ranks from disk, ends bitwise where the relaunch ended."""
    relaunched = _done(res)
    assert relaunched["size"] == 2
    by_hand = tmp_path / "by_hand"
    stopped = run_job(JOB, 4, "--checkpoint-dir", by_hand, "--stop-at", step, "--final-checkpoint", *args, env=ENV,
                      timeout=120)
    assert stopped.returncode == 0 and checkpoint.complete_steps(by_hand)[-1] == step, stopped.describe()
    again = run_job(JOB, 2, "--checkpoint-dir", by_hand, *args, env=ENV, timeout=120)
    assert again.returncode == 0, again.describe()
    assert next(iter(again.by_rank(event="resumed").values()))["hash"] == resumed["hash"]
    final = _done(again)
    assert final["steps"] == relaunched["steps"] and final["hash"] == relaunched["hash"]
    assert final["params"] == relaunched["params"]


@pytest.mark.parametrize("optimizer", ["zero", "ddp"])
def test_a_node_crash_ends_the_job_and_the_relaunch_resumes_from_the_nodes_memory(tmp_path, optimizer):
    args = ("--optimizer", optimizer)
    res, step, resumed = _crash_and_relaunch(tmp_path, *args, FTCOMM_SHM_DIR=str(tmp_path / "shm"))
    assert step == 13 and "resumed from the nodes' shared memory (step 13" in res.stderr, res.describe()
    _same_as_by_hand(tmp_path, step, res, resumed, *args)


def test_without_the_warm_tier_the_relaunch_resumes_from_disk(tmp_path):
    # --sync-writes: each step waits for the write in flight, so the checkpoint of step 12 is on
    # disk and published before the crash at 14, whatever the machine's load (without it, on a
    # loaded machine no write had completed by then and the relaunch rightly started over)
    res, step, resumed = _crash_and_relaunch(tmp_path, "--sync-writes", FTCOMM_WARM="0")
    assert step == 12 and f"resumed from {tmp_path / 'ckpt'}" in res.stderr, res.describe()
    _same_as_by_hand(tmp_path, step, res, resumed)
