"""Spare ranks with the torch backend: ``ftcomm-run --spares S`` and a DDP loop written
``resilient(loader, model=, optimizer=)`` + ``loader.epochs(E)``. A rank killed in a gradient
allreduce is replaced by a spare: the world size stays 4, every survivor keeps its rank, the
newcomer takes the dead rank's rank and samples and gets the survivors' state bitwise, and the
run ends where a failure-free run ends (to float rounding: DDP's buckets are regrouped at the
join, which changes the order of the ring's sums)."""
import collections

import numpy as np
import pytest

from harness import BUCKET_POINT, JOBS, run_job

pytest.importorskip("torch")

N, SAMPLES, BATCH, EPOCHS = 4, 384, 8, 2
STEPS_PER_EPOCH = SAMPLES // (N * BATCH)  # 12: no padding, so a re-split over 4 deals the same samples
JOB = JOBS / "torch_spares_train.py"
FIRST_KILL = "rank=2,point=reduce_scatter,step=6,kind=kill"  # world rank 2, in iteration 6


def run(spares: int, fault: str | None = None, *args, ftcomm_timeout: float = 30, env: dict | None = None):
    env = {"FTCOMM_TIMEOUT": str(ftcomm_timeout), **(env or {})}
    if fault:
        env["FTCOMM_FAULT"] = fault
    return run_job(JOB, N, "--epochs", EPOCHS, "--samples", SAMPLES, "--batch", BATCH, *args, env=env,
                   timeout=150, launcher_args=("--spares", str(spares)))


def applied_batches(job) -> dict:
    """world rank -> [(epoch, sample ids)] of its applied steps, in order."""
    out = collections.defaultdict(list)
    for r in job.reports:
        if r["kind"] == "batch" and not r["skipped"]:
            out[r["world_rank"]].append((r["epoch"], tuple(r["idx"])))
    return out


def check_every_sample_once(job) -> None:
    for epoch in range(EPOCHS):
        used = collections.Counter(i for r in job.reports if r["kind"] == "batch" and r["epoch"] == epoch
                                   and not r["skipped"] for i in r["idx"])
        assert sorted(used) == list(range(SAMPLES)), f"epoch {epoch}: samples lost"
        assert max(used.values()) == 1, f"epoch {epoch}: samples used twice"


def check_same_state(finals: dict) -> None:
    for key in ("params", "optimizer", "rng", "lr", "values"):
        assert len({str(rep[key]) for rep in finals.values()}) == 1, f"ranks differ in {key}"


_references: dict = {}


def failure_free(samples: int, plane: str = "ring"):
    """The same job without a failure (an idle spare released at the end), once per size and data
    plane."""
    if (samples, plane) not in _references:
        job = run(1, None, "--samples", samples, env={"FTCOMM_DATA_PLANE": plane})
        assert job.returncode == 0, job.describe()
        finals = job.by_rank(kind="final")
        assert sorted(finals) == list(range(N)), job.describe()
        check_same_state(finals)
        _references[samples, plane] = job
    return _references[samples, plane]


def samples_used(job) -> list:
    """Per epoch, how often each sample was used by an applied step."""
    return [collections.Counter(i for r in job.reports if r["kind"] == "batch" and r["epoch"] == epoch
                                and not r["skipped"] for i in r["idx"]) for epoch in range(EPOCHS)]


@pytest.mark.fault
@pytest.mark.timeout(500)
# 390: the sampler pads 2 samples per epoch; gloo: an inner gloo group moves the buckets
# (FTCOMM_DATA_PLANE=gloo), rebuilt for the survivors' own communicator and again at the join
@pytest.mark.parametrize("samples,plane", [(SAMPLES, "ring"), (SAMPLES + 6, "ring"), (SAMPLES, "gloo")])
def test_spare_takes_the_dead_ranks_place_in_ddp(samples, plane):
    victim, spare = 2, N
    steps_per_epoch = -(-(-(-samples // N)) // BATCH)  # ceil(ceil(samples / N) / BATCH)
    reference = failure_free(samples, plane)
    point = BUCKET_POINT[plane]
    job = run(1, f"rank={victim},point={point},step=6,kind=kill", "--samples", samples,
              env={"FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3, spare], job.describe()
    for world_rank, rep in finals.items():
        assert rep["size"] == N and rep["sampler"] == [rep["rank"], N]
        assert rep["group_ranks"] == list(range(N))  # torch's rank table is back to full size too
        assert rep["rank"] == (victim if world_rank == spare else world_rank)  # survivors keep their ranks
        assert rep["joined"] is (world_rank == spare)
        assert rep["applied"] == EPOCHS * steps_per_epoch and rep["redone"] == 1, rep
        if world_rank != spare:
            assert rep["recoveries"] == [[[victim], N, N, "spares", [victim]]]
    check_same_state(finals)

    # The hand-over: the newcomer's state when it starts equals, bitwise, what every survivor
    # holds after the voided step (= the last applied step): parameters, AdamW moments, RNG
    # (rewound to the voided step's start), LR.
    handed = job.by_rank(kind="handed")
    joined = job.by_rank(kind="joined")
    assert sorted(handed) == [0, 1, 3] and sorted(joined) == [spare], job.describe()
    fields = ("params", "optimizer", "rng", "lr", "applied", "epoch")
    for rep in handed.values():
        assert {k: rep[k] for k in fields} == {k: joined[spare][k] for k in fields}
    assert joined[spare]["applied"] == 6

    # Same samples on the same ranks, step for step, as the failure-free run (the newcomer goes
    # on with the dead rank's, the sampler's padding included), and the same random numbers:
    # the model has dropout, and the RNG state at the end is the failure-free run's.
    ref, got = applied_batches(reference), applied_batches(job)
    for rank in (0, 1, 3):
        assert got[rank] == ref[rank]
    assert got[victim] + got[spare] == ref[victim]
    assert samples_used(job) == samples_used(reference)
    ref_final = reference.by_rank(kind="final")[0]
    assert finals[0]["rng"] == ref_final["rng"]

    # DDP's gradient buckets end grouped as in the failure-free run (gradient-ready order), on the
    # newcomer too: the hand-over regroups in parameter order, then lets DDP regroup after the next
    # backward. (torch caches a bucket's parameter list once buckets were rebuilt, so on survivors
    # this is the grouping they had before the failure; the newcomer's list is built after its
    # last regrouping, and would be parameter order without the second one.)
    assert all(rep["buckets"] == ref_final["buckets"] for rep in finals.values()), \
        {w: r["buckets"] for w, r in finals.items()}
    # Within float rounding of the failure-free run: the one step reduced with the regrouped
    # buckets sums in another order.
    ref_values, values = np.array(ref_final["values"]), np.array(finals[0]["values"])
    assert np.abs(values - ref_values).max() <= 1e-6 * np.abs(ref_values).max()


def on_planes(cases: list, default_on_gloo: tuple = ()) -> list:
    """Each case on ftcomm's ring, and on the gloo data plane (FTCOMM_DATA_PLANE=gloo, where a
    gradient bucket's fault point is data_plane): the ids in ``default_on_gloo`` by default, the
    others behind the matrix marker."""
    out = []
    for case in cases:
        fault, *rest = case.values
        out.append(pytest.param("ring", fault, *rest, id=f"ring-{case.id}"))
        out.append(pytest.param("gloo", fault.replace("point=reduce_scatter", f"point={BUCKET_POINT['gloo']}"), *rest,
                                id=f"gloo-{case.id}", marks=() if case.id in default_on_gloo else pytest.mark.matrix))
    return out


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane,fault,survivors,newcomer_ranks,redone", on_planes([
    # World rank 0 hosts torch's TCP store and is DDP's broadcast root; its replacement (world
    # rank 4, now rank 0) is killed in turn, and world rank 5 takes the place.
    pytest.param(f"rank=0,point=reduce_scatter,step=6,kind=kill;rank={N},point=reduce_scatter,step=15,kind=kill",
                 [1, 2, 3], {0}, 2, id="rank 0 then its replacement"),
    # World rank 1 dies in the hand-over to the first newcomer: a second spare takes its place
    # and the hand-over starts again with two newcomers.
    pytest.param(f"{FIRST_KILL};rank=1,point=join,kind=kill", [0, 3], {1, 2}, 1, id="a survivor in the hand-over"),
], default_on_gloo=("a survivor in the hand-over",)))
def test_two_failures_two_spares_back_to_full_size(plane, fault, survivors, newcomer_ranks, redone):
    job = run(2, fault, env={"FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    newcomers = sorted(set(finals) - set(survivors))
    assert sorted(finals) == survivors + newcomers and all(w > N - 1 for w in newcomers), job.describe()
    assert {finals[w]["rank"] for w in newcomers} == newcomer_ranks
    assert all(finals[w]["rank"] == w and not finals[w]["joined"] for w in survivors)
    assert all(finals[w]["joined"] for w in newcomers)
    for w in survivors:  # each failure brought a spare in: every recovery kept the size
        assert [(e[2], e[3]) for e in finals[w]["recoveries"]] == [(N, "spares")] * 2
    for rep in finals.values():
        assert rep["size"] == N and rep["applied"] == EPOCHS * STEPS_PER_EPOCH and rep["redone"] == redone
    check_same_state(finals)
    check_every_sample_once(job)


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane,fault,args,env,redone", on_planes([
    # spares exhausted: the newcomer (world rank 4) is killed in training after it joined
    pytest.param(f"{FIRST_KILL};rank={N},point=reduce_scatter,step=15,kind=kill", (), {}, 2, id="killed after joining"),
    # killed inside the hand-over: the survivors start it again with nobody to hand to
    pytest.param(f"{FIRST_KILL};rank={N},point=join,kind=kill", (), {}, 1, id="killed in the hand-over"),
    # a 60 s set-up against FTCOMM_JOIN_TIMEOUT = 3 s: the newcomer stops beating after 3 s and
    # is fenced as a hung rank 5 s later
    pytest.param(FIRST_KILL, ("--newcomer-setup-s", 60), {"FTCOMM_JOIN_TIMEOUT": "3"}, 1, id="never arrives"),
    # arrives, then hangs in the hand-over: fenced at FTCOMM_TIMEOUT (5 s), not FTCOMM_JOIN_TIMEOUT
    pytest.param(f"{FIRST_KILL};rank={N},point=join,kind=hang", (), {"FTCOMM_JOIN_TIMEOUT": "600"}, 1,
                 id="hangs in the hand-over"),
]))
def test_newcomer_lost_with_no_spare_left_shrinks(plane, fault, args, env, redone):
    job = run(1, fault, *args, ftcomm_timeout=5 if env else 30, env={**env, "FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 1, 3], job.describe()
    for rep in finals.values():
        assert rep["size"] == N - 1 and rep["sampler"] == [rep["rank"], N - 1]
        assert rep["recoveries"] == [[[2], N, N, "spares", [2]], [[N], N, N - 1, "shrink", []]]
        assert rep["redone"] == redone
    if env:  # never arrived: fenced
        assert f"fencing world rank {N}" in job.stderr
    check_same_state(finals)
    check_every_sample_once(job)


@pytest.mark.fault
@pytest.mark.timeout(300)
@pytest.mark.parametrize("plane", ["ring", pytest.param("gloo", marks=pytest.mark.matrix)])
def test_survivor_lost_in_the_hand_over_with_no_spare_left_shrinks(plane):
    # World rank 1 dies in the hand-over to the only spare: the group shrinks to the two survivors
    # and the newcomer (world rank 4, now rank 1 of 3, promoted into a group of 4). All three must
    # deal the later epochs over 3 ranks: a newcomer whose sampler still counted 4 ranks ran 12 of
    # the 16 steps of epoch 1, left early, and the survivors shrank again without it.
    job = run(1, f"{FIRST_KILL.replace('reduce_scatter', BUCKET_POINT[plane])};rank=1,point=join,kind=kill",
              env={"FTCOMM_DATA_PLANE": plane})
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 3, N], job.describe()
    assert finals[N]["joined"] and finals[N]["rank"] == 1
    for w in (0, 3):
        assert finals[w]["recoveries"] == [[[2], N, N, "spares", [2]], [[1], N, N - 1, "shrink", []]]
    assert finals[N]["recoveries"] == [[[1], N, N - 1, "shrink", []]]
    # epoch 0: 6 steps over 4 ranks, then the other 192 samples over 3 (8 steps); epoch 1: 16
    steps = 6 + (SAMPLES - 6 * N * BATCH) // ((N - 1) * BATCH) + SAMPLES // ((N - 1) * BATCH)
    for rep in finals.values():
        assert rep["size"] == N - 1 and rep["sampler"] == [rep["rank"], N - 1]
        assert rep["applied"] == steps and rep["redone"] == 1
    check_same_state(finals)
    check_every_sample_once(job)


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_newcomer_set_up_longer_than_the_timeout():
    # The newcomer spends 12 s in its set-up, beyond FTCOMM_TIMEOUT = 5 s: the survivors wait for
    # it in the hand-over (FTCOMM_JOIN_TIMEOUT) instead of fencing it as a hung rank.
    job = run(1, "rank=1,point=reduce_scatter,step=3,kind=kill", "--newcomer-setup-s", 12, ftcomm_timeout=5)
    assert job.returncode == 0, job.describe()
    finals = job.by_rank(kind="final")
    assert sorted(finals) == [0, 2, 3, N], job.describe()
    assert finals[N]["rank"] == 1 and finals[N]["joined"] is True
    assert "fencing" not in job.stderr
    check_same_state(finals)
    check_every_sample_once(job)


@pytest.mark.fault
@pytest.mark.timeout(300)
def test_newcomer_with_another_model_fails_on_every_rank():
    job = run(1, "rank=2,point=reduce_scatter,step=6,kind=kill", "--newcomer-width", 65)
    refused = job.by_rank(kind="refused")
    assert sorted(refused) == [0, 1, 3, N], job.describe()
    assert {rep["type"] for rep in refused.values()} == {"InvalidInputError"}
    assert all("could not load the survivors'" in rep["error"] for rep in refused.values())
    assert not job.by_rank(kind="final")
    assert job.returncode not in (0, 124), job.describe()


@pytest.mark.fault
@pytest.mark.timeout(200)
def test_loop_a_spare_cannot_join_is_refused_on_every_rank():
    job = run(1, None, "--mode", "per-epoch")
    refused = job.by_rank(kind="refused")
    assert sorted(refused) == list(range(N)), job.describe()
    assert all("loader.epochs(E)" in rep["error"] for rep in refused.values())
    assert job.returncode not in (0, 124), job.describe()  # failed, and ended by itself
