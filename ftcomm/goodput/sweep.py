"""ETTR against world size for ftcomm (shrink, spares) and the baselines, the disk-fallback
probability per day for each k, and the k and disk interval to choose (``ftcomm-goodput sweep``).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, replace

import numpy as np

from . import model
from . import montecarlo as mc
from .inputs import Cluster, Costs, Policy

WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 10_000, 16384, 32768, 65536, 100_000)
RECOMMEND_AT = (1024, 10_000, 100_000)
KS = (0, 1, 2, 3)


def spare_nodes_for(nodes: int, spare_fraction: float, spare_nodes: int | None) -> int:
    """Spare nodes of a job of ``nodes`` nodes: ``spare_nodes`` if given, else
    ceil(spare_fraction x nodes)."""
    return spare_nodes if spare_nodes is not None else math.ceil(spare_fraction * nodes)


def _stats(values: np.ndarray) -> dict:
    return {"mc_mean": values.mean(axis=-1).tolist(), "mc_p05": np.percentile(values, 5, axis=-1).tolist(),
            "mc_p95": np.percentile(values, 95, axis=-1).tolist()}


def run_sweep(base: Cluster, costs: Costs, policy: Policy, *, world_sizes=WORLD_SIZES, spare_fraction: float = 0.01,
              spare_nodes: int | None = None, horizon_s: float = 30 * model.DAY_S, trials: int = 64,
              disk_trials: int = 2000, seed: int = 0, progress=None) -> dict:
    """Evaluates every strategy at every world size, analytically and by Monte Carlo.

    Args:
        base: the cluster (its ``world_size`` is replaced by each of ``world_sizes``).
        costs, policy: the inputs (``policy.spare_nodes`` is replaced per world size, see
            ``spare_nodes_for``).
        horizon_s: length of each simulated run (seconds); trials: runs per world size.
        disk_trials: simulated days per (world size, k) for the disk-fallback probability.
        seed: of numpy's default generator.
        progress: a callable taking one message string, or None.

    Returns:
        A JSON-serialisable dict: ``inputs``, ``world_sizes``, ``nodes``, ``job_mtbf_s``,
        ``strategies`` (per strategy: ``analytic`` and ``mc_mean``, ``mc_p05``, ``mc_p95`` lists
        over world sizes, plus its own figures), ``disk_fallback_per_day`` and
        ``recommendations``.
    """
    say = progress or (lambda msg: None)
    rng = np.random.default_rng(seed)
    clusters = [replace(base, world_size=w) for w in world_sizes]
    out = {"inputs": {"cluster": {k: v for k, v in asdict(base).items() if k != "world_size"},
                      "costs": costs.as_dict(), "policy": asdict(policy), "spare_fraction": spare_fraction,
                      "spare_nodes": spare_nodes, "horizon_s": horizon_s, "trials": trials,
                      "disk_trials": disk_trials, "seed": seed},
           "world_sizes": list(world_sizes), "nodes": [c.nodes for c in clusters],
           "job_mtbf_s": [c.job_mtbf_s for c in clusters], "strategies": {}, "timing_s": {}}
    spares = [spare_nodes_for(c.nodes, spare_fraction, spare_nodes) for c in clusters]

    t0 = time.perf_counter()
    say("Monte Carlo: ftcomm with shrink")
    shrink = mc.simulate_ftcomm(clusters, costs, policy, False, horizon_s, trials, rng)
    analytic = [model.ftcomm_ettr(c, costs, policy, False) for c in clusters]
    out["strategies"]["ftcomm_shrink"] = {
        "analytic": [a["ettr"] for a in analytic], **_stats(shrink["ettr"]),
        "disk_interval_s": [a["disk_interval_s"] for a in analytic], "regrow_below": [a["regrow_below"] for a in analytic],
        "planned_restarts_per_day": [a["planned_restarts_per_day"] for a in analytic],
        "mc_disk_fallbacks_per_run": shrink["disk_fallbacks"].mean(axis=1).tolist()}

    say("Monte Carlo: ftcomm with spares")
    sp_analytic = [model.ftcomm_ettr(c, costs, replace(policy, spare_nodes=s), True) for c, s in zip(clusters, spares)]
    sp_rows = mc.simulate_ftcomm(clusters, costs, policy, True, horizon_s, trials, rng, spare_nodes=spares)["ettr"]
    out["strategies"]["ftcomm_spares"] = {
        "analytic": [a["ettr"] for a in sp_analytic], **_stats(sp_rows), "spare_nodes": spares,
        "ettr_per_allocated_node": [a["ettr"] * c.nodes / (c.nodes + s) for a, c, s in zip(sp_analytic, clusters, spares)],
        "planned_restarts_per_day": [a["planned_restarts_per_day"] for a in sp_analytic]}

    say("Monte Carlo: checkpoint-restart at the Young/Daly interval")
    cr = [model.checkpoint_restart(c, costs) for c in clusters]
    cr_rows = np.array([mc.simulate_checkpoint_restart(c.job_mtbf_s, r["interval_s"], costs.checkpoint_s,
                                                       costs.restart_s, horizon_s, trials, rng)
                        for c, r in zip(clusters, cr)])
    out["strategies"]["checkpoint_restart"] = {
        "analytic": [r["ettr"] for r in cr], **_stats(cr_rows), "interval_s": [r["interval_s"] for r in cr],
        "exact_optimal_interval_s": [r["exact_optimal_interval_s"] for r in cr],
        "analytic_at_exact_optimum": [model.checkpoint_restart_ettr(r["exact_optimal_interval_s"], costs.checkpoint_s,
                                                                    costs.restart_s, c.job_mtbf_s)
                                      for c, r in zip(clusters, cr)]}

    say("Monte Carlo: idealized torchft")
    tf = [model.torchft(c, costs, policy) for c in clusters]
    tf_rows = np.array([mc.simulate_torchft(c, costs, policy, horizon_s, trials, rng) for c in clusters])
    out["strategies"]["torchft_idealized"] = {"analytic": [r["ettr"] for r in tf], **_stats(tf_rows),
                                              "groups": [r["groups"] for r in tf]}

    say("Monte Carlo: ftcomm with spares and warm restart")
    warm = replace(policy, warm_restart=True)
    wa_analytic = [model.ftcomm_ettr(c, costs, replace(warm, spare_nodes=s), True) for c, s in zip(clusters, spares)]
    wa_rows = mc.simulate_ftcomm(clusters, costs, warm, True, horizon_s, trials, rng, spare_nodes=spares)["ettr"]
    out["strategies"]["ftcomm_warm"] = {"analytic": [a["ettr"] for a in wa_analytic], **_stats(wa_rows),
                                        "p_warm": [a["p_warm"] for a in wa_analytic],
                                        "p_fatal": [a["p_fatal"] for a in wa_analytic]}
    out["timing_s"]["ettr_monte_carlo"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say("disk fallback per day")
    window = costs.vulnerable_s
    disk = {"k": list(KS), "window_s": window, "trials": disk_trials, "closed_form": {}, "monte_carlo": {}}
    for k in KS:
        disk["closed_form"][str(k)] = [model.disk_fallback_probability(c, k, window) for c in clusters]
        disk["monte_carlo"][str(k)] = {}
        for c in clusters:
            if c.world_size in RECOMMEND_AT:
                p, se = mc.disk_fallback_per_day(c, k, window, disk_trials, rng)
                disk["monte_carlo"][str(k)][str(c.world_size)] = {"p": p, "stderr": se, "days": disk_trials,
                                                                 "days_with_fallback": round(p * disk_trials)}
    out["disk_fallback_per_day"] = disk
    out["timing_s"]["disk_monte_carlo"] = time.perf_counter() - t0

    recs = []
    for w in RECOMMEND_AT:
        if w not in world_sizes:
            continue
        c = clusters[list(world_sizes).index(w)]
        s = spares[list(world_sizes).index(w)]
        by_k = {}
        for k in KS:
            pol = replace(policy, k=k, spare_nodes=s)
            by_k[k] = model.ftcomm_ettr(c, costs, pol, True)
        best = max(KS, key=lambda k: by_k[k]["ettr"])
        recs.append({"world_size": w, "nodes": c.nodes, "spare_nodes": s, "k": best,
                     "ettr_by_k": {str(k): by_k[k]["ettr"] for k in KS},
                     "disk_fallback_per_day": model.disk_fallback_probability(c, best, window),
                     "disk_interval_s": by_k[best]["disk_interval_s"], "regrow_below": by_k[best]["regrow_below"]})
    out["recommendations"] = recs
    return out


NAMES = {"ftcomm_shrink": "ftcomm, shrink", "ftcomm_spares": "ftcomm, spares",
         "checkpoint_restart": "checkpoint-restart (Young/Daly)", "torchft_idealized": "torchft-style (idealized)",
         "ftcomm_warm": "ftcomm, spares + warm restart"}


def format_sweep(result: dict) -> str:
    """The sweep as text tables (what ``ftcomm-goodput sweep`` prints)."""
    st = result["strategies"]
    lines = ["world size  nodes  job MTBF h   " + "  ".join(f"{NAMES[k]:>30}" for k in st)]
    for i, w in enumerate(result["world_sizes"]):
        cells = [f"{st[k]['analytic'][i]:.4f} (MC {st[k]['mc_mean'][i]:.4f})" for k in st]
        lines.append(f"{w:>10} {result['nodes'][i]:>6} {result['job_mtbf_s'][i] / 3600:>11.2f}   "
                     + "  ".join(f"{c:>30}" for c in cells))
    disk = result["disk_fallback_per_day"]
    lines.append(f"\nprobability per day of a disk fallback (closed form; Monte Carlo over {disk['trials']} days), "
                 f"window {disk['window_s']:.3g} s:")
    for k in disk["k"]:
        parts = []
        for w, p in zip(result["world_sizes"], disk["closed_form"][str(k)]):
            sim = disk["monte_carlo"][str(k)].get(str(w))
            if sim is None:
                continue
            parts.append(f"{w}: {p:.3g} (MC {sim['p']:.3g}: {sim['days_with_fallback']} of {sim['days']} days)")
        lines.append(f"  k={k}: " + ", ".join(parts))
    lines.append("\nrecommended (ftcomm with spares, best analytic ETTR over k = 0..3):")
    for r in result["recommendations"]:
        interval = "never (no event needs it)" if math.isinf(r["disk_interval_s"]) else f"{r['disk_interval_s'] / 3600:.2f} h"
        lines.append(f"  {r['world_size']:>7} ranks: k={r['k']} (ETTR {r['ettr_by_k'][str(r['k'])]:.4f}; by k "
                     + ", ".join(f"{k}: {v:.4f}" for k, v in r["ettr_by_k"].items())
                     + f"), disk checkpoint every {interval}, planned restart below {r['regrow_below']:.3f} "
                     f"of the nodes, disk fallback {r['disk_fallback_per_day']:.2g} per day")
    return "\n".join(lines)


def draw_sweep(result: dict, path) -> None:
    """ETTR against world size (left) and the disk-fallback probability per day for each k (right)
    as a PNG.

    Raises:
        ImportError: no matplotlib.
    """
    from .timeline import require_matplotlib

    plt = require_matplotlib()
    sizes = np.array(result["world_sizes"])
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(13, 5))
    for key, color in zip(NAMES, ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:olive")):
        s = result["strategies"][key]
        ax.plot(sizes, s["analytic"], color=color, label=NAMES[key])
        mean = np.array(s["mc_mean"])
        spread = [np.clip(mean - np.array(s["mc_p05"]), 0, None), np.clip(np.array(s["mc_p95"]) - mean, 0, None)]
        ax.errorbar(sizes, mean, yerr=spread, fmt="o",
                    color=color, ms=3, capsize=2, lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("ETTR")
    inp = result["inputs"]
    c = inp["costs"]
    ax.set_title(f"node MTBF {inp['cluster']['node_mtbf_s'] / 3600:.0f} h, {inp['cluster']['ranks_per_node']} ranks/node, "
                 f"k={inp['policy']['k']}; step {c['step_s']:.3g} s, replication {c['replication_share']:.1%}, "
                 f"detection {c['detection_s']:.3g} s,\nagree+shrink {c['agree_shrink_s']:.3g} s, checkpoint "
                 f"{c['checkpoint_s']:.3g} s, restart {c['restart_s']:.3g} s; "
                 "lines: closed form, dots: Monte Carlo mean and 5-95%", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    disk = result["disk_fallback_per_day"]
    for k in disk["k"]:
        p = np.array(disk["closed_form"][str(k)])
        line, = dax.plot(sizes, np.clip(p, 1e-15, None), label=f"k={k}")
        sims = disk["monte_carlo"][str(k)]
        xs = [int(w) for w, v in sims.items() if v["p"] > 0]
        dax.plot(xs, [sims[str(w)]["p"] for w in xs], "o", color=line.get_color(), ms=4)
    dax.set_xscale("log")
    dax.set_yscale("log")
    dax.set_ylim(1e-12, 2)
    dax.set_xlabel("world size (ranks)")
    dax.set_ylabel("probability of a disk fallback per day")
    dax.set_title("lines: closed form; dots: Monte Carlo (where it saw any)", fontsize=9)
    dax.grid(alpha=0.3)
    dax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
