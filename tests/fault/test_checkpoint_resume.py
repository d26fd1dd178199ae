"""The disk tier of the torch loop (``resilient(..., checkpoint_dir=..., checkpoint_every=N)``):
resume at a smaller, the same and a larger world size, and kills while a checkpoint is staged,
written or renamed. Job: tests/jobs/ckpt_torch.py (DDP on 480 toy samples, 8 per rank and step;
at 3 ranks an epoch is 20 steps)."""
import json
import math
import shutil
from collections import Counter

import numpy as np
import pytest

from ftcomm.training import checkpoint
from harness import JOBS, run_job

pytestmark = pytest.mark.fault
JOB = JOBS / "ckpt_torch.py"
SAMPLES = 480


def _run(n, ckpt, *args, fault=""):
    res = run_job(JOB, n, "--checkpoint-dir", ckpt, *args, env={"FTCOMM_TIMEOUT": "30", "FTCOMM_FAULT": fault},
                  timeout=120)
    assert res.returncode == 0, res.describe()
    return res


def _one(res, **match) -> dict:
    """The report every rank made alike (e.g. the same hash): one value, checked equal on all."""
    found = res.by_rank(**match)
    assert found, res.describe()
    values = {tuple(sorted((k, str(v)) for k, v in r.items() if k != "world_rank")) for r in found.values()}
    assert len(values) == 1, found
    return next(iter(found.values()))


def _ids(res, epoch, up_to=None) -> Counter:
    return Counter(i for r in res.reports if r["event"] == "used" and r["epoch"] == epoch
                   and (up_to is None or r["step"] <= up_to) for i in r["ids"])


@pytest.fixture(scope="module")
def stopped_at_12(tmp_path_factory):
    """A ZeRO run at 3 ranks stopped after step 12 (mid-epoch 0), its checkpoints (8 and 12)."""
    ckpt = tmp_path_factory.mktemp("stopped") / "ckpt"
    res = _run(3, ckpt, "--stop-at", "12")
    assert checkpoint.complete_steps(ckpt) == [8, 12]
    return ckpt, res


@pytest.mark.parametrize("size", [2, 4])
def test_resume_at_another_world_size_is_the_checkpoint_bitwise_and_uses_each_sample_once(
        stopped_at_12, tmp_path, size):
    saved, first = stopped_at_12
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    res = _run(size, ckpt)
    resumed = _one(res, event="resumed")
    assert resumed["step"] == 12 and resumed["size"] == size
    assert resumed["hash"] == _one(first, event="state", step=12)["hash"]  # re-sharded, bitwise
    # epoch 0: the first 12 steps at 3 ranks, the rest dealt over the new ranks; each sample once
    epoch0 = _ids(first, 0, up_to=12) + _ids(res, 0)
    assert sorted(epoch0) == list(range(SAMPLES)) and set(epoch0.values()) == {1}, epoch0.most_common(3)
    assert sorted(_ids(res, 1)) == list(range(SAMPLES)) and set(_ids(res, 1).values()) == {1}
    steps_left = (SAMPLES - 12 * 3 * 8) // (size * 8) + SAMPLES // (size * 8)
    assert _one(res, event="done")["steps"] == 12 + steps_left


def test_a_checkpoint_at_the_end_of_an_epoch_of_uneven_lists_resumes_at_the_next_epoch(tmp_path):
    # 385 samples at 4 ranks, world rank 3 killed in step 4: the other 289 of epoch 0 are dealt over
    # 3 ranks (lists of 97, 96, 96: 12 steps, the first rank's last batch of 9), so step 15 ends the
    # epoch. Its checkpoint resumed at 2 ranks goes on with epoch 1; counting the 9-sample batch as
    # 8 left one sample to deal, and a 16th step read it on both ranks.
    ckpt, common = tmp_path / "ckpt", ("--optimizer", "ddp", "--samples", 385, "--every", 15)
    first = _run(4, ckpt, *common, "--stop-at", 15, fault="rank=3,point=reduce_scatter,step=3,kind=kill")
    assert checkpoint.complete_steps(ckpt) == [15]
    res = _run(2, ckpt, *common)
    # (not _one: the ranks' RNG states differ, as the 9-sample batch drew more dropout numbers)
    resumed = res.by_rank(event="resumed")
    assert sorted(resumed) == [0, 1], res.describe()
    assert {(r["step"], r["hash"]) for r in resumed.values()} == {(15, _one(first, event="state", step=15)["hash"])}
    epoch0 = _ids(first, 0) + _ids(res, 0)
    assert sorted(epoch0) == list(range(385)) and set(epoch0.values()) == {1}, epoch0.most_common(3)
    epoch1 = _ids(res, 1)  # over 2 ranks: the sampler pads 385 to 386, repeating one sample
    assert sorted(epoch1) == list(range(385)) and sum(epoch1.values()) == 386, epoch1.most_common(3)
    assert _one(res, event="done")["steps"] == 15 + math.ceil(386 / 2 / 8)


def test_a_drop_last_loader_resumed_at_the_same_size_reads_the_batches_of_the_run_without_a_stop(tmp_path):
    # 385 samples at 4 ranks: 97 per rank, 12 batches of 8 and one sample left out per epoch
    args = ("--optimizer", "ddp", "--samples", 385, "--drop-last", "--every", 5)
    whole = _run(4, tmp_path / "whole", *args)
    _run(4, tmp_path / "ckpt", *args, "--stop-at", 5)
    res = _run(4, tmp_path / "ckpt", *args)
    assert {r["step"] for r in res.by_rank(event="resumed").values()} == {5}
    assert _one(res, event="done")["steps"] == _one(whole, event="done")["steps"] == 24
    for step in range(6, 25):  # the same batches of 8 on every rank; the left-out samples stay out
        assert res.by_rank(event="used", step=step) == whole.by_rank(event="used", step=step), step


@pytest.mark.parametrize("optimizer", ["zero", "ddp"])
def test_resume_at_the_same_world_size_reads_and_draws_as_the_run_without_a_stop(stopped_at_12, tmp_path, optimizer):
    whole = _run(3, tmp_path / "whole", "--optimizer", optimizer)
    ckpt = tmp_path / "ckpt"
    if optimizer == "zero":
        shutil.copytree(stopped_at_12[0], ckpt)
    else:
        _run(3, ckpt, "--optimizer", optimizer, "--stop-at", "12")
    twice = tmp_path / "twice"
    shutil.copytree(ckpt, twice)
    res = _run(3, ckpt, "--optimizer", optimizer)
    assert _one(res, event="resumed")["step"] == 12
    # the same samples in the same order on every rank, from the same RNG state (dropout)
    for step in range(13, 41):
        assert res.by_rank(event="used", step=step) == whole.by_rank(event="used", step=step), step
    # A fresh DDP groups its first step's gradients in another order than a trained one (DDP
    # regroups them after its first backward), so the ring sums that one step in another order:
    # the run ends within float rounding of the one without a stop, and bitwise where another
    # resume from the same checkpoint ends.
    ours, theirs = np.array(_one(res, event="done")["params"]), np.array(_one(whole, event="done")["params"])
    assert np.abs(ours - theirs).max() < 1e-4, np.abs(ours - theirs).max()
    assert _one(_run(3, twice, "--optimizer", optimizer), event="done")["hash"] == _one(res, event="done")["hash"]


@pytest.mark.parametrize("point,rank", [("checkpoint_stage", 1), ("checkpoint_write", 1), ("checkpoint_rename", 0)])
def test_a_kill_while_a_checkpoint_is_made_leaves_the_previous_one_loadable(tmp_path, point, rank):
    ckpt = tmp_path / "ckpt"
    res = _run(3, ckpt, "--stop-at", "10", "--sync-writes", fault=f"rank={rank},point={point},step=8")
    done = res.by_rank(event="done")
    assert sorted(done) == sorted({0, 1, 2} - {rank}) and all(d["size"] == 2 for d in done.values())
    assert checkpoint.complete_steps(ckpt) == [4]  # step 8's never became visible
    again = _run(2, ckpt, "--stop-at", "6")
    resumed = _one(again, event="resumed")
    assert resumed["step"] == 4 and resumed["hash"] == _one(res, event="state", step=4)["hash"]


def test_auto_interval_is_chosen_alike_on_every_rank_and_logged(tmp_path):
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    res = run_job(JOB, 3, "--checkpoint-dir", ckpt, "--every", "auto", "--log", logs,
                  env={"FTCOMM_TIMEOUT": "30", "FTCOMM_MTBF": "30"}, timeout=120)
    assert res.returncode == 0, res.describe()
    events = {rank: [json.loads(line) for line in (logs / f"rank{rank}.jsonl").read_text().splitlines()]
              for rank in range(3)}
    choices = {rank: [(e["step"], e["steps"]) for e in ev if e["event"] == "checkpoint_interval"]
               for rank, ev in events.items()}
    assert choices[0] and choices[0] == choices[1] == choices[2], choices
    for e in (e for ev in events.values() for e in ev if e["event"] == "checkpoint_interval"):
        # the rank's own proposal is Young/Daly of what it measured; the agreed one is the smallest
        assert e["interval_s"] == pytest.approx(math.sqrt(2 * e["checkpoint_s"] * (30 + e["restart_s"])), rel=1e-4)
        assert e["steps"] <= e["proposed_steps"] * 1.42 and e["restart_s"] > 0
    written = [e["step"] for e in events[0] if e["event"] == "checkpoint" and not e["final"]]
    assert written[0] == 8  # the first one measures
    # each later start is one agreed interval after the previous start (or later, if skipped)
    chosen = dict(choices[0])
    for before, after in zip(written, written[1:]):
        assert after - before >= chosen.get(before, 8), (written, chosen)
    # the run ends with a checkpoint of its last step (40: 2 epochs of 20), off the schedule if need be
    (last,) = [e["step"] for e in events[0] if e["event"] == "checkpoint" and e["final"]] or [written[-1]]
    assert checkpoint.complete_steps(ckpt)[-1] == last == 40


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(stopped_at_12, tmp_path):
    saved, first = stopped_at_12
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    damaged = ckpt / "step00000012" / "__2_0.distcp"  # the part rank 2 wrote; read back by rank 0 of 2
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x04  # one flipped bit in the middle of a tensor
    damaged.write_bytes(bytes(data))
    res = _run(2, ckpt, "--stop-at", "14")
    resumed = _one(res, event="resumed")
    assert resumed["step"] == 8 and resumed["hash"] == _one(first, event="state", step=8)["hash"]
    assert "__2_0.distcp: checksum" in res.stderr and "is unusable on some rank" in res.stderr, res.describe()
