"""Silent data corruption: a bit flipped (FTCOMM_FAULT kind=bitflip) in a ring chunk on arrival,
in a rank's result before the commit, in a rank's gradient or parameters. In transit, with the
guard (checksums) every rank raises the same SilentCorruptionError naming sender and receiver,
its buffer bitwise unchanged, nothing committed;
the redo on the same communicator equals the numpy reference on every rank. Without the guard the
flip commits: the test shows what the guard is for."""
import pytest

from harness import JOBS, run_job

COUNT = 10007  # several 4096-byte chunks per segment at 4 ranks

# (world size, receiving world rank, phase, ring step, chunk)
# (world size, receiving world rank, phase, ring step, chunk, dtype, op): every phase and ring step
# kind (first, middle, last), and each way a sum is taken (the reduction's loop for 4- and 8-byte
# types, a second pass for 16-bit ones and for the average's scaled result)
FLIPS = [(4, 2, "reduce_scatter", 0, 0, "float32", "sum"), (4, 0, "reduce_scatter", 2, 1, "float32", "sum"),
         (4, 3, "allgather", 0, 2, "float32", "sum"), (4, 1, "allgather", 2, 0, "float32", "sum"),
         (3, 1, "reduce_scatter", 1, 0, "int64", "max"), (2, 0, "allgather", 0, 1, "float32", "sum"),
         (4, 2, "reduce_scatter", 2, 0, "float16", "avg"), (2, 1, "allgather", 0, 0, "float64", "avg")]


def _spec(rank, point, ring_step, chunk):
    return f"rank={rank},point={point},step=1,ring_step={ring_step},chunk={chunk},kind=bitflip"


@pytest.mark.fault
@pytest.mark.parametrize("n,rank,point,ring_step,chunk,dtype,op", FLIPS,
                         ids=[f"n{f[0]}-rank{f[1]}-{f[2]}-{f[3]}-{f[4]}-{f[5]}-{f[6]}" for f in FLIPS])
def test_flip_in_transit_is_caught_on_every_rank_and_redone(n, rank, point, ring_step, chunk, dtype, op):
    job = run_job(JOBS / "allreduce_bitflip.py", n, COUNT, dtype, op, "checksums",
                  env={"FTCOMM_FAULT": _spec(rank, point, ring_step, chunk)}, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == list(range(n)), job.describe()
    sender = (rank - 1) % n
    for rep in reports.values():
        assert "in transit" in rep["error"].pop("message")
        assert rep["error"] == {"type": "SilentCorruptionError", "step": 1, "ranks": [sender, rank],
                                "failed_ranks": [], "unchanged": True, "names_ranks": True}, rep
        assert rep["correct"] is True
        assert rep["last_committed"] == 1 and rep["size"] == n
    assert len({rep["digest"] for rep in reports.values()}) == 1


# (world size, receiving world rank, ring step, chunk, dtype, op) in the committed reduce-scatter
RS_FLIPS = [(4, 1, 0, 0, "float32", "sum"), (4, 3, 2, 1, "float64", "avg"), (3, 0, 1, 1, "bfloat16", "max"),
            (2, 1, 0, 1, "int32", "sum")]


@pytest.mark.fault
@pytest.mark.parametrize("n,rank,ring_step,chunk,dtype,op", RS_FLIPS,
                         ids=[f"n{f[0]}-rank{f[1]}-{f[2]}-{f[3]}-{f[4]}-{f[5]}" for f in RS_FLIPS])
def test_flip_in_reduce_scatter_transit_is_caught_on_every_rank_and_redone(n, rank, ring_step, chunk, dtype, op):
    job = run_job(JOBS / "reduce_scatter_bitflip.py", n, "core", dtype, op,
                  env={"FTCOMM_FAULT": _spec(rank, "reduce_scatter", ring_step, chunk)}, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert "in transit" in rep["error"].pop("message")
        assert rep["error"] == {"type": "SilentCorruptionError", "step": 1, "ranks": [(rank - 1) % n, rank],
                                "failed_ranks": [], "unchanged": True}, rep
        assert rep["correct"] is True and rep["last_committed"] == 1


@pytest.mark.fault
def test_torch_reduce_scatter_tensor_is_redone_after_a_flip_in_transit():
    job = run_job(JOBS / "reduce_scatter_bitflip.py", 4, "torch", timeout=120,
                  env={"FTCOMM_FAULT": "rank=2,point=reduce_scatter,ring_step=1,chunk=0,kind=bitflip",
                       "FTCOMM_CHECKSUMS": "1"})
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["correct"] is True
        assert rep["corruptions"] == [[[1, 2], "reduce_scatter_tensor", "redone"]], rep


@pytest.mark.fault
@pytest.mark.parametrize("alias", ["same", "overlap"])
def test_bucket_of_aliased_buffers_is_restored_after_a_voided_step(alias):
    job = run_job(JOBS / "allreduce_alias.py", 4, alias, timeout=90,
                  env={"FTCOMM_FAULT": _spec(2, "reduce_scatter", 0, 0)})
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    assert all(rep == {"error": "SilentCorruptionError", "unchanged": True, "world_rank": rank}
               for rank, rep in reports.items()), reports


@pytest.mark.fault
def test_fingerprints_alone_turn_the_transit_checksums_on():
    """Fingerprints without checksums would let a flip in the allgather travel on around the ring,
    so that the majority holds the corrupted result and names the one right rank; with them the
    transit check catches it first and names the link."""
    job = run_job(JOBS / "allreduce_bitflip.py", 4, COUNT, "float32", "sum", "fingerprints",
                  env={"FTCOMM_FAULT": _spec(2, "allgather", 0, 0)}, timeout=90)
    assert job.returncode == 0, job.describe()
    for rep in job.by_rank().values():
        assert (rep["error"]["type"], rep["error"]["ranks"]) == ("SilentCorruptionError", [1, 2]), rep
        assert rep["correct"] is True


@pytest.mark.fault
def test_without_the_guard_a_flip_commits_silently():
    n = 4
    job = run_job(JOBS / "allreduce_bitflip.py", n, COUNT, "float32", "sum", "off",
                  env={"FTCOMM_FAULT": _spec(2, "reduce_scatter", 0, 0)}, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert all(rep["error"] is None for rep in reports.values())
    assert not all(rep["correct"] for rep in reports.values())  # the corrupted sum was committed


@pytest.mark.fault
@pytest.mark.parametrize("n,named,words", [(4, [1], "world rank 1 differs from the majority"),
                                           (2, [0, 1], "no majority; world ranks 0, 1 differ")])
def test_a_rank_whose_result_differs_is_named_and_the_step_redone(n, named, words):
    """A flip in world rank 1's result after the ring (in its memory, not in transit), fingerprints
    on: the results' fingerprints, agreed with the commit, differ, so no rank commits;
    every rank raises the same error naming the odd rank out (both, at 2 ranks), buffers unchanged,
    and the redo equals numpy's result."""
    job = run_job(JOBS / "allreduce_bitflip.py", n, COUNT, "float32", "sum", "fingerprints",
                  env={"FTCOMM_FAULT": "rank=1,point=result,step=1,kind=bitflip"}, timeout=90)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        error = rep["error"]
        assert (error["type"], error["step"], error["ranks"], error["unchanged"]) == ("ResultsDifferError", 1, named, True)
        assert words in error["message"] and "the ranks' results differ" in error["message"]
        assert rep["correct"] is True and rep["last_committed"] == 1
    assert len({rep["digest"] for rep in reports.values()}) == 1


def _runs(job_file, args, flip, by_rank_kind):
    """The job's per-rank final reports, failure-free and with ``flip`` (guard on in both)."""
    out = []
    for fault in ("", flip):
        job = run_job(JOBS / job_file, 4, *args, env={"FTCOMM_FAULT": fault, "FTCOMM_CHECKSUMS": "1"}, timeout=120)
        assert job.returncode == 0, job.describe()
        out.append(by_rank_kind(job))
    return out


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_sharded_optimizer_redoes_a_corrupted_step_and_ends_as_the_clean_run():
    flip = "rank=1,point=reduce_scatter,ring_step=0,chunk=0,kind=bitflip"  # the first guarded allreduce
    clean, flipped = _runs("elastic_train.py", ["--epochs", 1], flip, lambda job: job.by_rank(event="done"))
    assert sorted(flipped) == [0, 1, 2, 3]
    for rank in range(4):
        assert clean[rank]["corruptions"] == []
        assert len(flipped[rank]["corruptions"]) == 1
        _, ranks, action = flipped[rank]["corruptions"][0]
        assert ranks == [0, 1] and action == "redone"
        assert flipped[rank]["params"] == clean[rank]["params"]  # bitwise the failure-free run
        assert flipped[rank]["steps"] == clean[rank]["steps"] and flipped[rank]["failures"] == 0


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_ddp_redoes_a_corrupted_bucket_and_ends_as_the_clean_run():
    flip = "rank=3,point=allgather,ring_step=1,chunk=0,kind=bitflip"
    clean, flipped = _runs("torch_ddp_kill.py", ["--epochs", 1], flip, lambda job: job.by_rank(kind="final"))
    assert sorted(flipped) == [0, 1, 2, 3]
    for rank in range(4):
        assert clean[rank]["corruptions"] == []
        assert [c[1:] for c in flipped[rank]["corruptions"]] == [[[2, 3], "redone"]]
        assert flipped[rank]["params"] == clean[rank]["params"]
        assert flipped[rank]["recoveries"] == []


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_ddp_rank_whose_parameters_flipped_is_repaired_from_the_majority():
    flip = "rank=2,point=params,step=3,kind=bitflip"  # rank 2's memory, right after applied step 3
    args = ["--epochs", 1, "--check-every", 1]
    clean, flipped = _runs("torch_ddp_kill.py", args, flip, lambda job: job.by_rank(kind="final"))
    for rank in range(4):
        assert clean[rank]["corruptions"] == []
        assert flipped[rank]["corruptions"] == [[3, [2], "repaired from world rank 0"]]
        assert flipped[rank]["params"] == clean[rank]["params"]  # repaired before the next step: bitwise
        assert flipped[rank]["size"] == 4


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_ddp_rank_that_diverges_again_is_fenced_and_the_group_goes_on():
    flips = "rank=2,point=params,step=3,kind=bitflip;rank=2,point=params,step=6,kind=bitflip"
    job = run_job(JOBS / "torch_ddp_kill.py", 4, "--epochs", 1, "--check-every", 1,
                  env={"FTCOMM_FAULT": flips}, timeout=120)
    finals = job.survivors_of_a_fencing(2, 4)
    for rep in finals.values():
        assert [c[1:] for c in rep["corruptions"]] == [
            [[2], "repaired from world rank 0"], [[2], "fenced world ranks [2] (diverged again within 1000 steps)"]]
        assert [r[0] for r in rep["recoveries"]] == [[2]]
    assert len({rep["params"] for rep in finals.values()}) == 1


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_ddp_gradient_flipped_in_backward_is_caught_by_the_norm_check_and_redone():
    """A flipped exponent bit in rank 2's local gradient: the transit guard cannot see it (the data
    arrive as sent), the ranks' gradient norms, riding along with the bucket allreduce, do. The step
    is voided and redone on every rank and the run ends bitwise where the clean run ends."""
    flip = "rank=2,point=gradient,step=5,kind=bitflip"
    clean, flipped = _runs("torch_ddp_kill.py", ["--epochs", 1, "--grad-outliers", "redo"], flip,
                           lambda job: job.by_rank(kind="final"))
    assert sorted(flipped) == [0, 1, 2, 3]
    for rank in range(4):
        assert clean[rank]["corruptions"] == [] and clean[rank]["redone"] == 0
        assert flipped[rank]["corruptions"] == [[5, [2], "voided and redone"]]
        assert (flipped[rank]["applied"], flipped[rank]["redone"]) == (clean[rank]["applied"], 1)
        assert flipped[rank]["params"] == clean[rank]["params"]


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_ddp_gradient_flip_logged_only_is_applied():
    """The same flip under the "log" policy: reported on every rank, and the corrupted average is
    applied (every rank alike, so the state check would not see it): what "redo" is for. The loop
    builds ``resilient(...)`` anew every epoch: the model's comm hook (DDP takes one) is reused."""
    flip = "rank=2,point=gradient,step=5,kind=bitflip"
    clean, flipped = _runs("torch_ddp_kill.py", ["--epochs", 2, "--loader-per-epoch", "--grad-outliers", "log"],
                           flip, lambda job: job.by_rank(kind="final"))
    for rank in range(4):
        assert flipped[rank]["corruptions"] == [[5, [2], "logged, applied"]] and flipped[rank]["redone"] == 0
        assert flipped[rank]["params"] != clean[rank]["params"]
    assert len({rep["params"] for rep in flipped.values()}) == 1


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_gradient_norm_check_raises_no_false_alarm_in_1000_healthy_steps():
    """1,000 DDP steps at 4 ranks (batches of 8, trained to a near fit, where the ranks' gradient
    norms differ by up to 77x) with the check on: no event, no step redone."""
    job = run_job(JOBS / "torch_ddp_kill.py", 4, "--epochs", 4, "--samples", 8000, "--grad-outliers", "redo",
                  timeout=240)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 2, 3]
    for rep in finals.values():
        assert (rep["applied"], rep["redone"], rep["corruptions"]) == (1000, 0, [])


# (job, its arguments, flip, event action): a flip at rest in a live shard or a replica, scrubbed
# every 2 steps (ShardedOptimizer.check_state) under the elastic driver and torch's ZeRO.
AT_REST = [
    ("elastic_train.py", ["--epochs", 1, "--check-every", 2], "rank=1,point=shard,step=4,kind=bitflip",
     [4, [1], "rebuilt from intact copies (live shard of world rank(s) [1])"]),
    ("elastic_train.py", ["--epochs", 1, "--check-every", 2], "rank=2,point=replica,step=4,kind=bitflip",
     [4, [2], "rebuilt from intact copies (replica(s) held by world rank(s) [2])"]),
    ("torch_zero.py", ["--mode", "kill", "--epochs", 1, "--check-every", 2], "rank=1,point=shard,step=4,kind=bitflip",
     [4, [1], "rebuilt from intact copies (live shard of world rank(s) [1])"]),
    ("torch_zero.py", ["--mode", "kill", "--epochs", 1, "--check-every", 2], "rank=3,point=replica,step=6,kind=bitflip",
     [6, [3], "rebuilt from intact copies (replica(s) held by world rank(s) [3])"]),
]


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("job_file,args,flip,event", AT_REST, ids=["elastic-shard", "elastic-replica", "zero-shard",
                                                                  "zero-replica"])
def test_sharded_state_flipped_at_rest_is_rebuilt_from_intact_copies(job_file, args, flip, event):
    """A bit flipped in an owner's live shard or in a buddy's replica between two steps: the
    scrub finds it on its checksum, every rank logs the same event and rebuilds from intact copies;
    the run ends with the clean run's parameters and whole optimizer state, bitwise."""
    final = (lambda job: job.by_rank(event="done")) if job_file == "elastic_train.py" else \
        (lambda job: job.by_rank(kind="final"))
    out = []
    for fault in ("", flip):
        job = run_job(JOBS / job_file, 4, *args, env={"FTCOMM_FAULT": fault}, timeout=150)
        assert job.returncode == 0, job.describe()
        out.append(final(job))
    clean, flipped = out
    assert sorted(flipped) == [0, 1, 2, 3]
    for rank in range(4):
        assert clean[rank]["corruptions"] == [] and flipped[rank]["corruptions"] == [event]
        assert (flipped[rank]["params"], flipped[rank]["state"]) == (clean[rank]["params"], clean[rank]["state"])


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_rank_whose_result_differs_twice_fences_itself_and_ddp_goes_on():
    """World rank 2's allreduce result flipped in its memory at two gradient steps (fingerprints on):
    the first time it is singled out by the majority and the step is redone; the second time,
    within 1,000 steps, it fences itself and the survivors recover from it as from any failure
    (shrink), ending with identical parameters."""
    flips = "rank=2,point=result,step=3,kind=bitflip;rank=2,point=result,step=6,kind=bitflip"
    job = run_job(JOBS / "torch_ddp_kill.py", 4, "--epochs", 1,
                  env={"FTCOMM_FAULT": flips, "FTCOMM_FINGERPRINTS": "1"}, timeout=120)
    assert job.returncode == 0, job.describe()
    assert "world rank 2 fences itself" in job.stderr
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    for rep in finals.values():
        assert rep["size"] == 3 and [r[:3] for r in rep["recoveries"]] == [[[2], 4, 3]]
        assert rep["corruptions"] == [[3, [2], "redone"], [6, [2], "redone"]]
    assert len({rep["params"] for rep in finals.values()}) == 1
