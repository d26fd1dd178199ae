"""The elastic driver. Sample accounting across a shrink, the disk fallback when a shard
and its only buddy die together, and the digits demo reaching its accuracy target after a kill."""
import json
from collections import defaultdict

import pytest

from ftcomm.training import checkpoint
from harness import JOBS, REPO, run_job

pytestmark = pytest.mark.fault
TIMEOUT = 120


def _train(fault, *args):
    return run_job(JOBS / "elastic_train.py", 4, *args, env={"FTCOMM_FAULT": fault, "FTCOMM_TIMEOUT": "30"},
                   timeout=TIMEOUT)


def test_every_sample_used_once_per_epoch_across_two_shrinks():
    # 300 samples, global batch 32: 10 steps per epoch. Rank 2 dies in step 6 (epoch 0), rank 0 in
    # step 13 (epoch 1): the survivors re-split the rest of each epoch.
    res = _train("rank=2,point=train_step,step=6;rank=0,point=train_step,step=13")
    assert res.returncode == 0, res.describe()
    done = res.by_rank(event="done")
    assert sorted(done) == [1, 3], res.describe()
    assert all(d["steps"] == 20 and d["failures"] == 2 and d["redone"] == 2 and d["size"] == 2 for d in done.values())
    per_step = defaultdict(dict)  # step -> world rank -> report of that committed step
    for r in res.reports:
        if r["event"] == "used":
            assert r["world_rank"] not in per_step[r["step"]], "a step committed twice"
            per_step[r["step"]][r["world_rank"]] = r
    assert sorted(per_step) == list(range(1, 21))
    epochs = defaultdict(list)
    for step, ranks in per_step.items():
        expected_ranks = [0, 1, 2, 3] if step < 6 else [0, 1, 3] if step < 13 else [1, 3]
        assert sorted(ranks) == expected_ranks, (step, sorted(ranks))
        indices = [i for r in ranks.values() for i in r["indices"]]
        assert {r["global_count"] for r in ranks.values()} == {len(indices)}
        epochs[next(iter(ranks.values()))["epoch"]] += indices
    for epoch, used in epochs.items():
        assert sorted(used) == list(range(300)), f"epoch {epoch}: a sample skipped or used twice"
    rec = [r for r in res.reports if r["event"] == "recovered"]
    assert {(r["step"], tuple(r["lost_world_ranks"])) for r in rec} == {(6, (2,)), (13, (0,))}
    assert all(r["bytes_moved"] > 0 and r["detection_s"] >= 0 and r["policy"] == "shrink" for r in rec)


def test_state_lost_without_checkpoint(tmp_path):
    res = _train("rank=1,point=train_step,step=10;rank=2,point=train_step,step=10")
    lost = res.by_rank(event="state_lost")
    assert sorted(lost) == [0, 3] and all(r["lost_shards"] == [1] and r["step"] == 9 for r in lost.values()), \
        res.describe()


def test_disk_fallback_when_shard_and_buddy_die(tmp_path):
    res = _train("rank=1,point=train_step,step=10;rank=2,point=train_step,step=10",
                 "--checkpoint-dir", tmp_path, "--checkpoint-every", "4")
    assert res.returncode == 0, res.describe()
    rec = res.by_rank(event="recovered")
    assert sorted(rec) == [0, 3], res.describe()
    # the newest checkpoint complete when the ranks died: step 8, or step 4 when step 8's was still
    # being written in the background (it is then abandoned)
    (restored,) = {r["disk_restore"] for r in rec.values()}
    assert restored in (4, 8) and all(r["step"] == 10 for r in rec.values())  # the interrupted step
    done = res.by_rank(event="done")
    # the steps after the checkpoint are redone, and step 10, which was interrupted
    assert all(d["steps"] == 20 and d["redone"] == 10 - restored and d["size"] == 2 for d in done.values())
    assert all(d["accuracy"] > 0.9 for d in done.values())
    # the checkpoint's epoch position was restored: step 9 used the same global batch both times
    used9 = [r for r in res.reports if r["event"] == "used" and r["step"] == 9]
    first = sorted(i for r in used9 if r["size"] == 4 for i in r["indices"])
    again = sorted(i for r in used9 if r["size"] == 2 for i in r["indices"])
    assert first == again and len(first) == 32
    # the run's last step is checkpointed at its end; the one before is the newest the schedule (every
    # 4 steps) completed: later ones may have been skipped while a slow write was in flight
    kept = checkpoint.complete_steps(tmp_path)
    assert len(kept) == 2 and kept[-1] == 20 and kept[0] % 4 == 0 and restored <= kept[0] < 20, kept


def test_digits_demo_reaches_target_accuracy_after_a_kill():
    res = run_job(REPO / "examples" / "train_digits.py", 4, "--kill", "2@60", "--no-progress",
                  "--log-dir", REPO / "results" / "test_train_digits", env={"FTCOMM_TIMEOUT": "30"}, timeout=240)
    assert res.returncode == 0, res.describe()
    line = next(l for l in res.stdout.splitlines() if l.startswith("SUMMARY "))
    summary = json.loads(line[len("SUMMARY "):])
    assert summary["accuracy"] >= 0.95 and summary["world_size"] == 3 and summary["steps"] == 440
    assert summary["failures"] == 1 and summary["redone_steps"] == 1
    (repair,) = summary["mttr"]
    assert repair["killed_rank"] == 2 and 0 < repair["mttr_s"] < 10
    assert "recovery timeline:" in res.stdout
