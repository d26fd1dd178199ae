"""Warm restart: a whole job that dies is relaunched by `ftcomm-run --restarts` and resumes from
the committed shards and replicas its nodes still hold in shared memory (no disk). Two made-up
nodes x 2 ranks (`--fake-nodes`), the elastic driver (tests/jobs/elastic_train.py: 300 samples,
batches of 32, 2 epochs = 20 steps, SGD with momentum, k=1 node-aware buddies). At step 7 node n2
crashes (its PRRTE daemon and ranks SIGKILLed) and Open MPI ends the job; ftcomm-run removes n2's
segments (a real node's memory is gone with it) and relaunches. Segments go under a FTCOMM_SHM_DIR
of the test's own."""
import json
import threading
import time

import pytest

from ftcomm.training import node_memory
from ftcomm.training.replica import HEADER_BYTES

from harness import JOBS, run_job

pytestmark = pytest.mark.fault
JOB = JOBS / "elastic_train.py"


def _env(tmp_path, **more) -> dict:
    return {"FTCOMM_TIMEOUT": "30", "FTCOMM_SHM_DIR": str(tmp_path / "shm"), **more}


def _crashed_run(tmp_path, hosts: str, *args, n=4, **env):
    (tmp_path / "hosts").write_text(hosts)
    (tmp_path / "logs").mkdir(exist_ok=True)
    return run_job(JOB, n, "--crash-node", "n2@7", "--log", tmp_path / "logs", *args, env=_env(tmp_path, **env),
                   timeout=240, launcher_args=["--hostfile", tmp_path / "hosts", "--fake-nodes", "--ranks-per-node",
                                               "2", "--restarts", "2", "--restart-backoff", "0.5"])


def _events(tmp_path, rank: int, name: str) -> list:
    lines = (tmp_path / "logs" / f"rank{rank}.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _done(res) -> dict:
    done = res.by_rank(event="done")
    assert done and len({(d["state"], d["params"]) for d in done.values()}) == 1, res.describe()
    return next(iter(done.values()))


def test_a_node_crash_resumes_from_the_survivors_memory_bitwise_as_a_shrink(tmp_path):
    other_job = tmp_path / "shm" / "ftcomm-0-another-job" / "n1"
    other_job.mkdir(parents=True)
    (other_job / "L0-W0-E0-1.seg").write_bytes(b"FTCSEG01" + bytes(100))  # never read, never removed
    res = _crashed_run(tmp_path, "n1 slots=2\nn2 slots=2\n")
    assert res.returncode == 0 and "relaunch 1 of 2" in res.stderr, res.describe()
    assert sorted(res.by_rank(event="crash")) == [2, 3]
    for rank in (0, 1):
        (resumed,) = _events(tmp_path, rank, "resumed")
        # step 6 was the last committed; n2's shards came from their replicas on n1
        assert resumed["from"] == "memory" and resumed["step"] == 6 and resumed["world_size"] == 2
        assert resumed["from_world_size"] == 4 and resumed["bytes_read"] > 0
        # n1 held a copy of every old shard: each replica was copied there, only its header sent
        assert resumed["bytes_replicated"] == HEADER_BYTES
    warm = _done(res)
    assert warm["size"] == 2 and warm["steps"] == 20
    # the same job, where n2's ranks die at step 7 and the survivors shrink in memory
    shrunk = run_job(JOB, 4, env=_env(tmp_path, FTCOMM_FAULT="rank=2,point=train_step,step=7;"
                                                            "rank=3,point=train_step,step=7"),
                     timeout=240, launcher_args=["--hostfile", tmp_path / "hosts", "--fake-nodes",
                                                 "--ranks-per-node", "2"])
    assert shrunk.returncode == 0, shrunk.describe()
    in_memory = _done(shrunk)
    assert in_memory["failures"] == 1 and in_memory["size"] == 2
    assert (warm["state"], warm["params"]) == (in_memory["state"], in_memory["params"])
    # the job's segments went with ftcomm-run; the other job's stayed
    assert [p.name for p in (tmp_path / "shm").iterdir()] == ["ftcomm-0-another-job"]
    assert (other_job / "L0-W0-E0-1.seg").exists()


def test_a_relaunch_onto_a_spare_host_ends_where_the_failure_free_run_ends(tmp_path):
    res = _crashed_run(tmp_path, "n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    assert res.returncode == 0 and "relaunch 1 of 2" in res.stderr, res.describe()
    resumed = {rank: _events(tmp_path, rank, "resumed")[-1] for rank in range(4)}
    # n3 had no segments: the survivors on n1 fed its ranks
    assert all(r["from"] == "memory" and r["step"] == 6 and r["world_size"] == 4 for r in resumed.values())
    warm = _done(res)
    plain = run_job(JOB, 4, env=_env(tmp_path), timeout=240)
    assert plain.returncode == 0, plain.describe()
    assert warm["size"] == 4 and (warm["state"], warm["params"]) == (_done(plain)["state"], _done(plain)["params"])


def test_a_shard_held_nowhere_falls_back_to_disk_and_says_which(tmp_path):
    # without replicas n2's shards lived only on n2
    res = _crashed_run(tmp_path, "n1 slots=2\nn2 slots=2\n", "--replicas", "0", "--checkpoint-dir", tmp_path / "ckpt",
                       "--checkpoint-every", "2")
    assert res.returncode == 0, res.describe()
    (incomplete, *_) = _events(tmp_path, 0, "warm_resume_incomplete")
    assert incomplete["step"] == 6 and incomplete["missing_shard"] in (2, 3)
    (resumed,) = _events(tmp_path, 0, "resumed")
    # the newest checkpoint published before the crash (under load a write still in flight at
    # the crash, or skipped while an earlier one was, leaves an older one the newest)
    published = [e["step"] for e in _events(tmp_path, 0, "checkpoint_published") if e["time"] < resumed["time"]]
    assert resumed["from"] == "disk" and resumed["step"] == max(published) and 2 <= resumed["step"] <= 6, published
    assert _done(res)["size"] == 2


def test_a_second_failure_during_the_resume_is_survived(tmp_path):
    # world rank 1 dies in the relaunch's re-shard: rank 0 recovers and resumes alone, from the
    # segments of its node (its own, and those the dead rank left there)
    res = _crashed_run(tmp_path, "n1 slots=2\nn2 slots=2\n", FTCOMM_FAULT="rank=1,point=warm_resume,step=6")
    assert res.returncode == 0, res.describe()
    (recovered,) = _events(tmp_path, 0, "recovered")
    assert recovered["lost_world_ranks"] == [1]
    (resumed,) = _events(tmp_path, 0, "resumed")
    assert resumed["from"] == "memory" and resumed["step"] == 6 and resumed["world_size"] == 1
    done = res.by_rank(event="done")
    assert sorted(done) == [0] and done[0]["steps"] == 20 and done[0]["accuracy"] > 0.9


def _corrupt_when_dropped(shm, lost: str, shard: int, done: list) -> None:
    """Waits until ftcomm-run drops made-up node ``lost`` (its segment directory goes), then flips a
    byte in the data of the first committed copy of ``shard`` still on another node."""
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        jobs = list(shm.glob("ftcomm-*")) if shm.exists() else []
        if jobs and (jobs[0] / "n1").exists() and not (jobs[0] / lost).exists():
            for node in sorted(p for p in jobs[0].iterdir() if p.is_dir()):
                for copy in node_memory.scan(str(node), before_launch=1):
                    if copy.shard == shard and copy.step == 6 and not done:
                        with open(copy.path, "r+b") as f:
                            f.seek(node_memory.DATA_OFFSET + 8)
                            byte = f.read(1)
                            f.seek(node_memory.DATA_OFFSET + 8)
                            f.write(bytes([byte[0] ^ 0x40]))
                        done.append(copy.path)
            if done:
                return
        time.sleep(0.05)


def test_a_damaged_copy_is_not_used_and_another_node_s_copy_is(tmp_path):
    # 3 nodes x 2 ranks, 2 buddies per shard (node-aware: on the next 2 nodes); n3 crashes at step
    # 7; while ftcomm-run waits to relaunch, a byte of one copy of shard 4 (n3's) is flipped: the
    # relaunch must take shard 4 from the other node's copy, and end as the shrink does
    damaged = []
    watcher = threading.Thread(target=_corrupt_when_dropped, args=(tmp_path / "shm", "n3", 4, damaged), daemon=True)
    watcher.start()
    (tmp_path / "hosts").write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    (tmp_path / "logs").mkdir()
    res = run_job(JOB, 6, "--crash-node", "n3@7", "--replicas", "2", "--log", tmp_path / "logs", env=_env(tmp_path),
                  timeout=300, launcher_args=["--hostfile", tmp_path / "hosts", "--fake-nodes", "--ranks-per-node", "2",
                                              "--restarts", "1", "--restart-backoff", "5"])
    watcher.join(1)
    assert res.returncode == 0 and len(damaged) == 1, (damaged, res.describe())
    resumed = [_events(tmp_path, rank, "resumed")[-1] for rank in range(4)]
    assert all(r["from"] == "memory" and r["step"] == 6 and r["world_size"] == 4 for r in resumed), resumed
    warm = _done(res)
    shrunk = run_job(JOB, 6, "--replicas", "2", env=_env(tmp_path, FTCOMM_FAULT="rank=4,point=train_step,step=7;"
                                                                             "rank=5,point=train_step,step=7"),
                     timeout=300, launcher_args=["--hostfile", tmp_path / "hosts", "--fake-nodes",
                                                 "--ranks-per-node", "2"])
    assert shrunk.returncode == 0, shrunk.describe()
    assert (warm["state"], warm["params"]) == (_done(shrunk)["state"], _done(shrunk)["params"])
