"""The goodput model: Young/Daly, ETTR against MTBF, the disk-fallback probability against its
closed form for each k, the Monte Carlo against the closed forms, and the inputs."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from ftcomm.goodput import model
from ftcomm.goodput import montecarlo as mc
from ftcomm.goodput.inputs import Cluster, Costs, Policy
from ftcomm.goodput.predict import predict_run
from ftcomm.training.buddies import buddies

# In the range measured here by benchmarks/mttr.py at 10M parameters (README, "Recovery time"),
# with cross-node detection and restart figures of a cluster.
COSTS = Costs(step_s=0.24, replication_share=0.046, detection_s=5.0, agree_shrink_s=1.0, rebuild_s=0.07,
              redo_s=0.30, checkpoint_s=60.0, restart_s=600.0, disk_restore_s=30.0)


def test_young_daly_formulas():
    assert model.young_daly_interval(50, 3600, 100) == pytest.approx(math.sqrt(2 * 50 * 3700))
    assert model.young_daly_interval(50, 3600) == pytest.approx(600.0)  # Young: sqrt(2 C M)
    # Daly (2006), figure 3: M = 24 h, delta = 5 min -> tau_opt = 117 min (higher order)
    assert model.daly_higher_order_interval(5, 24 * 60) == pytest.approx(117, abs=0.5)
    with pytest.raises(ValueError):
        model.young_daly_interval(-1, 10)
    w = model.lambert_w0(-0.2)
    assert w * math.exp(w) == pytest.approx(-0.2, abs=1e-14) and -1 < w < 0
    assert model.lambert_w0(-1 / math.e) == -1.0


def test_exact_optimum_is_the_argmax_of_the_analytic_ettr():
    c, r, m = 60.0, 600.0, 3600.0
    grid = np.linspace(300, 1200, 90001)
    best = grid[np.argmax(model.checkpoint_restart_ettr(grid, c, r, m))]
    assert model.exact_optimal_interval(c, m) == pytest.approx(best, abs=0.02)
    # first order is off by more than 2% at C/M = 1/60, Daly's higher order is not
    assert abs(model.young_daly_interval(c, m, r) / best - 1) > 0.02
    assert model.daly_higher_order_interval(c, m) == pytest.approx(best, rel=1e-3)
    # near W0's branch point (rare failures: M / C = 10^10) the series takes over from Halley
    assert model.exact_optimal_interval(60.0, 6e11) == pytest.approx(math.sqrt(2 * 60 * 6e11) - 40, rel=1e-9)
    c_small = -math.log(1 - 0.0099 ** 2 / 2)  # just inside the series' range, where Halley still converges
    assert model.exact_optimal_interval(c_small, 1.0) == pytest.approx(1 + model.lambert_w0(-math.exp(-1 - c_small)),
                                                                       rel=1e-8)
    # k = 3 with independent failures: a disk fallback every ~10^15 days, a disk interval of years
    k1 = model.ftcomm_ettr(Cluster(10_000), COSTS, Policy(k=1), False)
    k3 = model.ftcomm_ettr(Cluster(10_000), COSTS, Policy(k=3), False)
    assert k3["disk_interval_s"] > 1e9 and k3["disk_factor"] > 0.9999
    assert k3["ettr"] / k1["ettr"] == pytest.approx((1 - 3 * 0.046) / (1 - 0.046), rel=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_simulated_checkpoint_restart_peaks_at_the_young_daly_interval(seed):
    """C / M small (0.5 s checkpoints, 9 s restarts, one failure an hour: the first-order regime):
    the interval that maximizes the simulated ETTR (a parabola through 12 intervals from 0.5x to
    2x, the same failure times for each) and the analytic one are within 2% of sqrt(2 C (M + R))."""
    c, r, m = 0.5, 9.0, 3600.0
    t_yd = model.young_daly_interval(c, m, r)
    factors = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 1.8, 2.0])
    ettr = np.array([mc.simulate_checkpoint_restart(m, f * t_yd, c, r, 2000 * m, 256, np.random.default_rng(seed)).mean()
                     for f in factors])
    a, b, _ = np.polyfit(np.log(factors), ettr, 2)
    assert a < 0
    assert math.exp(-b / (2 * a)) == pytest.approx(1.0, abs=0.02)
    grid = t_yd * np.linspace(0.5, 2, 30001)
    assert grid[np.argmax(model.checkpoint_restart_ettr(grid, c, r, m))] / t_yd == pytest.approx(1.0, abs=0.02)
    # the simulation and the closed form agree at the optimum (standard error ~1e-5 here)
    assert ettr[5] == pytest.approx(model.checkpoint_restart_ettr(t_yd, c, r, m), abs=2e-4)
    assert ettr[5] > ettr[0] + 1e-3 and ettr[5] > ettr[-1] + 1e-3


def test_ettr_rises_with_mtbf():
    sizes = (1024, 10_000, 100_000)
    for w in sizes:
        rows = []
        for hours in (100, 300, 1000, 3000, 10_000):
            cl = Cluster(w, node_mtbf_s=hours * 3600.0)
            pol = Policy(k=1, spare_nodes=math.ceil(0.01 * cl.nodes))
            rows.append([model.ftcomm_ettr(cl, COSTS, pol, False)["ettr"], model.ftcomm_ettr(cl, COSTS, pol, True)["ettr"],
                         model.checkpoint_restart(cl, COSTS)["ettr"], model.torchft(cl, COSTS, pol)["ettr"]])
        rows = np.array(rows)
        assert (np.diff(rows, axis=0) > 0).all(), (w, rows)
    # and in the simulation, where the differences are well above its noise
    cl = [Cluster(10_000, node_mtbf_s=h * 3600.0) for h in (100, 1000, 10_000)]
    sim = mc.simulate_ftcomm(cl, COSTS, Policy(k=1), False, 7 * 86400, 32, np.random.default_rng(0))["ettr"].mean(axis=1)
    assert sim[0] < sim[1] < sim[2]


@pytest.mark.parametrize("spares", [False, True])
@pytest.mark.parametrize("cluster", [
    Cluster(1024, node_mtbf_s=300 * 3600.0),
    Cluster(10_000),
    Cluster(10_000, correlated_fraction=0.1, correlated_nodes=4, fatal_fraction=0.05),
    Cluster(100_000, node_mtbf_s=3000 * 3600.0),
    Cluster(100_000, fatal_fraction=0.5),  # a restart every 12 min: Daly's complete model, not first order
])
def test_simulation_matches_the_closed_form(cluster, spares):
    pol = Policy(k=1, spare_nodes=math.ceil(0.01 * cluster.nodes))
    sim = mc.simulate_ftcomm([cluster], COSTS, pol, spares, 30 * 86400, 64, np.random.default_rng(1))
    analytic = model.ftcomm_ettr(cluster, COSTS, pol, spares)["ettr"]
    assert sim["ettr"].mean() == pytest.approx(analytic, rel=0.02, abs=0.003)  # the closed form is a product of factors
    if cluster.fatal_fraction:
        assert sim["fatal"].mean() > 0
    if cluster.correlated_fraction:  # groups of 4 nodes hold a node and its only buddy node
        assert sim["disk_fallbacks"].mean() > 0
    tf = mc.simulate_torchft(cluster, COSTS, pol, 30 * 86400, 64, np.random.default_rng(2)).mean()
    assert tf == pytest.approx(model.torchft(cluster, COSTS, pol)["ettr"], abs=0.003)


@pytest.mark.parametrize("cluster", [
    Cluster(10_000, fatal_fraction=0.25),
    Cluster(10_000, correlated_fraction=0.1, correlated_nodes=4, fatal_fraction=0.5),
])
def test_warm_restart_turns_most_job_ends_into_relaunches_from_memory(cluster):
    pol = Policy(k=1, spare_nodes=math.ceil(0.01 * cluster.nodes), warm_restart=True)
    cold = model.ftcomm_ettr(cluster, COSTS, replace(pol, warm_restart=False), True)
    warm = model.ftcomm_ettr(cluster, COSTS, pol, True)
    # the job ends as often, but only the ends that lost every copy of a shard roll back to disk
    assert warm["p_warm"] + warm["p_fatal"] == pytest.approx(cold["p_fatal"])
    assert 0 < warm["p_fatal"] < 0.2 * cold["p_fatal"] and warm["ettr"] > cold["ettr"]
    assert warm["disk_interval_s"] > cold["disk_interval_s"]  # fewer events need the disk
    sim = mc.simulate_ftcomm([cluster], COSTS, pol, True, 30 * 86400, 64, np.random.default_rng(3))
    assert sim["ettr"].mean() == pytest.approx(warm["ettr"], rel=0.02, abs=0.003)


def test_shrinking_costs_capacity_and_spares_give_it_back():
    cl = Cluster(10_000)
    shrink = model.ftcomm_ettr(cl, COSTS, Policy(k=1), False)
    spares = model.ftcomm_ettr(cl, COSTS, Policy(k=1, spare_nodes=13), True)
    assert shrink["mean_capacity"] < spares["mean_capacity"] < 1
    assert shrink["planned_restarts_per_day"] > spares["planned_restarts_per_day"] > 0
    # replication's share is charged k times
    k2 = model.ftcomm_ettr(cl, COSTS, Policy(k=2), False)
    assert k2["replication_factor"] == pytest.approx(1 - 2 * 0.046)


def test_buddies_are_the_next_k_nodes():
    """The disk-fallback model's placement is ftcomm's: with equal nodes, a rank's k buddies sit on
    the k nodes after its own (ring order)."""
    ranks_per_node, nodes = 4, 8
    names = [f"n{r // ranks_per_node}" for r in range(ranks_per_node * nodes)]
    for k in (1, 2, 3):
        for rank in range(len(names)):
            node = rank // ranks_per_node
            assert sorted(int(names[b][1:]) for b in buddies(rank, len(names), k, names)) == \
                sorted((node + d) % nodes for d in range(1, k + 1))


@pytest.mark.parametrize("k", [1, 2])
def test_disk_fallback_probability_against_its_closed_form(k):
    """Independent failures, 100 nodes, node MTBF 10^4 s, 100 s until the rebuild (lambda W = 0.01,
    where the first-order closed form is good to a few %), over one hour: the simulation places
    failures on nodes and finds chains of k + 1 down nodes."""
    cl = Cluster(800, ranks_per_node=8, node_mtbf_s=1e4)
    window, hour = 100.0, 3600.0
    closed = model.disk_fallback_probability(cl, k, window, hour)
    expected = {1: -math.expm1(-100 * 2 * 1e-4 * 0.01 * hour), 2: -math.expm1(-100 * 3 * 1e-4 * 0.01 ** 2 * hour)}[k]
    assert closed == pytest.approx(expected)
    trials = 4000 if k == 1 else 40_000
    hits = mc.simulate_disk_fallback(cl, k, window, hour, trials, np.random.default_rng(k))
    se = math.sqrt(closed * (1 - closed) / trials)
    assert abs(hits.mean() - closed) < 4 * se + 0.05 * closed, (hits.mean(), closed, se)


def test_k_against_correlated_failures():
    """Groups of 4 consecutive nodes failing together lose state for k <= 3 (the group holds a
    node and all its buddies), not for k = 4; k = 0 falls back to disk at every failure."""
    cl = Cluster(800, ranks_per_node=8, node_mtbf_s=1e5, correlated_fraction=0.5, correlated_nodes=4)
    day, rng = model.DAY_S, np.random.default_rng(5)
    events_per_day = cl.event_rate * day
    assert model.disk_fallback_probability(cl, 0, 10.0) == pytest.approx(-math.expm1(-events_per_day))
    assert model.disk_fallback_probability(cl, 3, 10.0) == pytest.approx(-math.expm1(-0.5 * events_per_day), rel=1e-3)
    assert model.disk_fallback_probability(cl, 4, 10.0) < 1e-6
    for k, closed in ((0, model.disk_fallback_probability(cl, 0, 10.0)),
                      (3, model.disk_fallback_probability(cl, 3, 10.0)), (4, 0.0)):
        p = mc.simulate_disk_fallback(cl, k, 10.0, day, 3000, rng).mean()
        assert p == pytest.approx(closed, abs=0.03), (k, p, closed)


def test_costs_from_mttr_json(tmp_path):
    """benchmarks/mttr.py's layout: steady, memory, memory_spares and disk of one size."""
    entry = {"size": "10M", "steady": {"step_s": 0.24, "replication_overhead": 0.046},
             "memory": {"detection_s": 0.067, "agree_shrink_s": 0.010, "rebuild_s": 0.044, "redo_s": 0.30},
             "memory_spares": {"detection_s": 0.10, "agree_shrink_s": 0.017, "rebuild_s": 0.30, "redo_s": 0.70},
             "disk": {"mttr_s": 8.7, "checkpoint_s": 0.5, "load_s": 0.8}}
    path = tmp_path / "mttr.json"
    path.write_text(json.dumps({"path": "elastic", "ranks": 4, "results": [dict(entry, size="1M"), entry]}))
    c = Costs.from_json(path, "10M", restart_s=600.0)
    assert (c.step_s, c.replication_share, c.detection_s, c.rebuild_s, c.checkpoint_s, c.disk_restore_s) == \
        (0.24, 0.046, 0.067, 0.044, 0.5, 0.8)
    assert c.restart_s == 600.0 and c.pre_s == pytest.approx(0.12)  # half a step
    assert c.memory_stall_s() == pytest.approx(0.12 + 0.067 + 0.010 + 0.044 + 0.06)
    assert c.memory_stall_s(spares=True) == pytest.approx(0.12 + 0.10 + 0.017 + 0.30 + 0.46)
    assert Costs.from_json(path, "10M").restart_s == pytest.approx(8.7 - 0.24)
    with pytest.raises(ValueError, match="no results entry of size '100M'"):
        Costs.from_json(path, "100M")
    with pytest.raises(ValueError, match="non-negative"):
        replace(c, detection_s=-1.0)


def test_predict_run():
    c = replace(COSTS, step_s=0.1, replication_share=0.1, detection_s=0.08, agree_shrink_s=0.02, rebuild_s=0.03,
                redo_s=0.12, pre_failure_s=0.02)
    spares = predict_run(c, 4, 10, 1, "spares")
    assert spares["failures_s"] == pytest.approx(0.17) and spares["wall_s"] == pytest.approx(1.17)
    assert spares["goodput"] == pytest.approx(0.9 / 1.17)
    # shrink: 5 steps at 4 ranks, 5 at 3 (4/3 as long)
    shrink = predict_run(c, 4, 10, 1, "shrink")
    assert shrink["steps_s"] == pytest.approx(0.5 + 5 * 0.1 * 4 / 3)
    with pytest.raises(ValueError):
        predict_run(c, 2, 10, 2, "shrink")


def test_sweep_cli(tmp_path, capsys):
    from ftcomm.goodput import goodput_cli

    entry = {"size": "10M", "steady": {"step_s": 0.24, "replication_overhead": 0.046},
             "memory": {"detection_s": 0.067, "agree_shrink_s": 0.010, "rebuild_s": 0.044, "redo_s": 0.30},
             "disk": {"mttr_s": 8.7, "checkpoint_s": 0.5, "load_s": 0.8}}
    (tmp_path / "mttr.json").write_text(json.dumps({"results": [entry]}))
    out = tmp_path / "out"
    try:
        import matplotlib  # noqa: F401  (the bench and demo extras install it)
        plot = []
    except ImportError:
        plot = ["--no-plot"]
    assert goodput_cli.main(["sweep", "--costs", str(tmp_path / "mttr.json"), "--world-sizes", "8,10000",
                             "--trials", "8", "--horizon-days", "2", "--disk-trials", "50", "--restart-s", "600",
                             "--detection-s", "5", "--out", str(out), *plot]) == 0
    result = json.loads((out / "goodput.json").read_text())
    assert plot or (out / "goodput.png").stat().st_size > 10_000
    assert result["world_sizes"] == [8, 10000] and result["nodes"] == [1, 1250]
    assert result["job_mtbf_s"][1] == pytest.approx(3600.0)
    costs = Costs(step_s=0.24, replication_share=0.046, detection_s=5.0, agree_shrink_s=0.010, rebuild_s=0.044,
                  redo_s=0.30, checkpoint_s=0.5, restart_s=600.0, disk_restore_s=0.8, spares_detection_s=5.0)
    cl = Cluster(10_000)
    assert result["inputs"]["costs"]["spares_detection_s"] == 5.0  # given once, for both policies
    assert result["strategies"]["checkpoint_restart"]["analytic"][1] == pytest.approx(model.checkpoint_restart(cl, costs)["ettr"])
    assert result["strategies"]["checkpoint_restart"]["interval_s"][1] == pytest.approx(math.sqrt(2 * 0.5 * 4200))
    assert result["strategies"]["ftcomm_shrink"]["analytic"][1] == pytest.approx(
        model.ftcomm_ettr(cl, costs, Policy(k=1), False)["ettr"])
    assert result["strategies"]["ftcomm_spares"]["spare_nodes"] == [1, 13]
    assert [r["world_size"] for r in result["recommendations"]] == [10000]
    text = capsys.readouterr().out
    assert "10000   1250        1.00" in text and "recommended" in text
    assert goodput_cli.main(["sweep", "--costs", str(tmp_path / "none.json"), "--no-plot"]) == 1
    assert "No such file" in capsys.readouterr().err


def test_sweep_cli_without_matplotlib(tmp_path, capsys, monkeypatch):
    import sys

    from ftcomm.goodput import goodput_cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert goodput_cli.main(["sweep", "--costs", str(tmp_path / "x.json")]) == 2
    assert "drawing needs matplotlib: pip install 'ftcomm[bench]'" in capsys.readouterr().err
