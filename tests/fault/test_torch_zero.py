"""ftcomm.torch.ZeroRedundancyOptimizer in 4-rank DDP jobs (tests/jobs/torch_zero.py): failure-free
against torch's own ZeroRedundancyOptimizer over gloo in the same job; a rank killed (or exiting,
hung, stopped) in each phase of a step (DDP's gradient allreduce in backward, the shard update,
the parameter allgather, the replica update), on ftcomm's ring and on the gloo data plane (which
carries the allreduce and the allgather): the step is voided, the rebuilt state equals the last committed one bitwise,
survivors end identical, each replica equals its owner's shard; the same kills with a spare: the
newcomer takes the dead rank's shard and the run ends where a failure-free run ends (to float
rounding); bad input refused on every rank."""
import numpy as np
import pytest

from harness import BUCKET_POINT, JOBS, run_job

pytest.importorskip("torch")

PHASES = {
    "backward allreduce": "point=reduce_scatter,step=5",
    "shard update": "point=shard_update,step=5",
    "parameter allgather": "point=param_allgather,step=5",
    "replica update": "point=replicate,step=5",
}


def _check_replicas_equal_their_owners(finals: dict) -> None:
    """Every shard's replica, held by its buddy, equals the owner's live shard (CRC-32)."""
    live = {rep["rank"]: rep["live_crc"] for rep in finals.values()}
    held = {int(shard): crc for rep in finals.values() for shard, crc in rep["replica_crcs"].items()}
    assert held == live, (held, live)


@pytest.mark.fault
@pytest.mark.timeout(200)
@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_matches_torch_zero_over_gloo(optimizer):
    job = run_job(JOBS / "torch_zero.py", 4, "--mode", "reference", "--optimizer", optimizer, timeout=160)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="reference")
    assert sorted(reports) == [0, 1, 2, 3], job.describe()
    for rep in reports.values():
        assert rep["steps"] == 24
        assert rep["param_diff"] <= 1e-6, rep   # float rounding: gloo and ftcomm sum in other orders
        base = {"AdamW": 1e-2, "SGD": 0.05}[optimizer]
        # 24 steps, StepLR(10, 0.5): both optimizers' groups at a quarter of their start
        assert rep["lr"] == rep["ref_lr"] == pytest.approx([base / 4, base / 8]), rep
    head = reports[0]
    assert head["state_keys"] and head["groups_equal"], head
    assert head["state_diff"] <= 1e-6, head
    assert head["torch_loads_it"], head


# (data plane, phase, how, the victim): by default every phase killed on the ring, and on the gloo
# plane (which also carries the parameter allgather) a kill in both of its collectives and a
# stopped rank (fenced) in the allgather, world rank 0 too (it also serves the inner group's
# store); the whole plane x phase x (kill, exit, hang, stop) matrix with ``pytest -m matrix``.
CELLS = [("ring", phase, "kill", 2) for phase in PHASES] + [
    ("gloo", "backward allreduce", "kill", 2), ("gloo", "parameter allgather", "kill", 2),
    ("gloo", "parameter allgather", "stop", 2), ("gloo", "parameter allgather", "stop", 0)]
MATRIX = [(plane, phase, kind, 2) for plane in BUCKET_POINT for phase in PHASES
          for kind in ("kill", "exit", "hang", "stop") if (plane, phase, kind, 2) not in CELLS]


def _cell_id(cell) -> str:
    *what, victim = cell
    return "-".join(what) + ("" if victim == 2 else f"-rank{victim}")


def _fault(victim: int, plane: str, phase: str, kind: str) -> str:
    where = PHASES[phase].replace("reduce_scatter", BUCKET_POINT[plane])
    return f"rank={victim},{where},kind={kind}"


def _completed_on_the_plane(phase: str, applied: int) -> dict:
    """What the gloo plane completed on a survivor: every applied step's bucket and allgather, and
    those of the voided step that ran before the victim failed."""
    voided_reduced = phase != "backward allreduce"
    voided_gathered = phase == "replica update"
    return {"allreduce": applied + voided_reduced, "allgather": applied + voided_gathered}


@pytest.mark.fault
@pytest.mark.timeout(200)
@pytest.mark.parametrize("plane,phase,kind,victim", [pytest.param(*c, id=_cell_id(c)) for c in CELLS]
                         + [pytest.param(*c, id=_cell_id(c), marks=pytest.mark.matrix) for c in MATRIX])
def test_kill_in_each_phase_rebuilds_the_committed_state(plane, phase, kind, victim):
    n = 4
    job = run_job(JOBS / "torch_zero.py", n, "--mode", "kill", timeout=160,
                  env={"FTCOMM_FAULT": _fault(victim, plane, phase, kind), "FTCOMM_DATA_PLANE": plane,
                       "FTCOMM_FENCE_TIMEOUT": "5",
                       # a hung rank still answers the liveness probes: the collective's deadline finds it
                       **({"FTCOMM_TIMEOUT": "15"} if kind == "hang" else {})})
    assert job.returncode == 0, job.describe()
    if kind == "hang":  # judged at the deadline of the step's collective it kept waiting, not of the agreement after it
        assert job.fenced_at(victim) and not any(call.startswith("agree") for call in job.fenced_at(victim)), \
            job.describe()
    finals = job.by_rank(kind="final")
    survivors = [r for r in range(n) if r != victim]
    assert sorted(finals) == survivors, job.describe()
    voided = [r for r in job.reports if r["kind"] == "voided"]
    assert len(voided) == n - 1, job.describe()
    for rep in voided:
        assert rep["equal"], "rebuilt state differs from the last committed step"
        assert rep["rebuild"] == {"from_replica": [victim], "old_size": n, "new_size": n - 1}
    for rep in finals.values():
        assert rep["size"] == n - 1 and rep["redone"] == 1 and rep["rebuilt_equal"] == [True]
        assert [lost for lost, *_ in rep["recoveries"]] == [[victim]]
        assert rep["step_id"] == rep["applied"]
        assert rep["accuracy"] >= 0.75, rep
        assert rep["plane"] == plane
        if plane == "gloo":
            assert rep["plane_completed"] == _completed_on_the_plane(phase, rep["applied"]), rep
    assert len({rep["params"] for rep in finals.values()}) == 1, "survivors' parameters differ"
    assert len({rep["state"] for rep in finals.values()}) == 1, "survivors' optimizer states differ"
    _check_replicas_equal_their_owners(finals)


@pytest.mark.fault
@pytest.mark.timeout(200)
@pytest.mark.parametrize("plane", BUCKET_POINT)
def test_a_second_rank_killed_in_the_rebuild(plane):
    # world rank 2 dies in step 5's allgather, world rank 3 in the rebuild that follows (of
    # committed step 4): with two replicas per shard both shards survive, and the rebuild starts
    # again over the last 2 ranks
    n = 4
    job = run_job(JOBS / "torch_zero.py", n, "--mode", "kill", "--replicas", 2, timeout=160,
                  env={"FTCOMM_FAULT": f"{_fault(2, plane, 'parameter allgather', 'kill')};"
                                       "rank=3,point=rebuild,step=4,kind=kill", "FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1], job.describe()
    voided = [r for r in job.reports if r["kind"] == "voided"]
    assert len(voided) == 2 and all(r["equal"] for r in voided), voided
    assert all(r["rebuild"] == {"from_replica": [2, 3], "old_size": n, "new_size": 2} for r in voided), voided
    for rep in finals.values():
        assert rep["size"] == 2 and rep["redone"] == 1 and rep["step_id"] == rep["applied"]
        assert rep["recoveries"] == [[[2], 4, 3, "ZeroRedundancyOptimizer.step"],
                                     [[3], 3, 2, "ZeroRedundancyOptimizer rebuild"]], rep
        if plane == "gloo":
            assert rep["plane_completed"] == _completed_on_the_plane("parameter allgather", rep["applied"]), rep
    assert len({rep["params"] for rep in finals.values()}) == 1, "survivors' parameters differ"
    assert len({rep["state"] for rep in finals.values()}) == 1, "survivors' optimizer states differ"
    _check_replicas_equal_their_owners(finals)


_reference: dict = {}


def _failure_free_values():
    """Final parameters of the job without a failure (one idle spare, released at the end)."""
    if "values" not in _reference:
        job = run_job(JOBS / "torch_zero.py", 4, "--mode", "kill", timeout=160, launcher_args=("--spares", "1"))
        assert job.returncode == 0, job.describe()
        finals = job.by_rank(kind="final")
        assert sorted(finals) == [0, 1, 2, 3] and all(r["applied"] == 24 for r in finals.values())
        _reference["values"] = np.array(finals[0]["values"])
    return _reference["values"]


# every phase on the ring; on the gloo plane the allgather by default, the rest behind the marker
SPARE_CELLS = [pytest.param("ring", phase, id=f"ring-{phase}") for phase in PHASES] + [
    pytest.param("gloo", phase, id=f"gloo-{phase}", marks=() if phase == "parameter allgather" else pytest.mark.matrix)
    for phase in PHASES]


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane,phase", SPARE_CELLS)
def test_kill_with_a_spare_ends_where_the_failure_free_run_ends(plane, phase):
    n, victim, spare = 4, 2, 4
    want = _failure_free_values()
    job = run_job(JOBS / "torch_zero.py", n, "--mode", "kill", timeout=160, launcher_args=("--spares", "1"),
                  env={"FTCOMM_FAULT": _fault(victim, plane, phase, "kill"), "FTCOMM_TIMEOUT": "30",
                       "FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3, spare], job.describe()
    assert finals[spare]["joined"] and finals[spare]["rank"] == victim
    voided = [r for r in job.reports if r["kind"] == "voided"]
    assert len(voided) == n - 1 and all(r["equal"] for r in voided), voided
    # one shard moved, to the newcomer, from the buddy that kept the dead rank's replica
    assert all(r["rebuild"] == {"from_replica": [victim], "old_size": n, "new_size": n} for r in voided)
    for rep in finals.values():
        assert rep["size"] == n and rep["applied"] == 24 and rep["redone"] == 1
        assert rep["plane"] == plane
        # float rounding only: the redone step's gradient is summed in another order (and on the
        # gloo plane every step's)
        np.testing.assert_allclose(rep["values"], want, rtol=0, atol=1e-6)
    assert len({rep["state"] for rep in finals.values()}) == 1
    _check_replicas_equal_their_owners(finals)


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane", ["ring", pytest.param("gloo", marks=pytest.mark.matrix)])
def test_survivor_lost_in_the_hand_over_with_no_spare_left(plane):
    # World rank 2 dies in backward and the only spare takes its place; world rank 0 (the store's
    # host, the hand-over's root) dies in the hand-over. The group shrinks to the two survivors
    # and the newcomer, which takes the shards over 3 ranks and deals the rest of the run as they
    # do: 6 steps over 4 ranks, the other 192 samples of epoch 0 over 3 (8 steps), epoch 1 (16).
    fault = f"rank=2,point={BUCKET_POINT[plane]},step=6,kind=kill;rank=0,point=join,kind=kill"
    job = run_job(JOBS / "torch_zero.py", 4, "--mode", "kill", timeout=200, launcher_args=("--spares", "1"),
                  env={"FTCOMM_FAULT": fault, "FTCOMM_TIMEOUT": "30", "FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [1, 3, 4], job.describe()
    assert finals[4]["rank"] == 1
    for rep in finals.values():
        assert rep["size"] == 3 and rep["applied"] == 6 + 8 + 16 and rep["redone"] == 1, rep
    voided = [r for r in job.reports if r["kind"] == "voided"]
    assert len(voided) == 2 and all(r["equal"] for r in voided), voided
    assert len({rep["params"] for rep in finals.values()}) == 1, "parameters differ"
    assert len({rep["state"] for rep in finals.values()}) == 1, "optimizer states differ"
    _check_replicas_equal_their_owners(finals)


@pytest.mark.fault
@pytest.mark.timeout(120)
def test_bad_input_is_refused_on_every_rank():
    n = 3
    job = run_job(JOBS / "torch_zero_bad.py", n, timeout=90)
    assert job.returncode == 0, job.describe()
    cases = [r for r in job.reports if r["kind"] == "case"]
    expected = {"lbfgs": ("ValueError", "closure"), "adafactor": ("ValueError", "whole-tensor"),
                "groups_differ": ("InvalidInputError", "rank 1 (world rank 1) has 2 param group(s)"),
                "not_a_class": ("ValueError", "'adam'"), "frozen_params": ("ValueError", "requires_grad=False"),
                "consolidate_to_bad_rank": ("ValueError", "to=7"),
                "state_dict_unconsolidated": ("RuntimeError", "consolidate_state_dict")}
    for name, (error, text) in expected.items():
        seen = [r for r in cases if r["case"] == name]
        assert len(seen) == n, (name, seen)
        assert {r["error"] for r in seen} == {error}, seen
        assert all(text in r["text"] for r in seen), seen
    # the same text on every rank (the groups case names both ranks' groups everywhere)
    for name in expected:
        if name != "state_dict_unconsolidated":  # names the local rank, on purpose
            assert len({r["text"] for r in cases if r["case"] == name}) == 1, name
    assert all(r["stepped"] for r in job.reports if r["kind"] == "after")
    added = [r for r in job.reports if r["kind"] == "add_group"]
    assert len(added) == n and all(r["diff"] <= 1e-6 for r in added), added
