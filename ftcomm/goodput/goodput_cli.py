"""ftcomm-goodput: ETTR of long training runs at cluster scale, by a closed-form model and a
Monte Carlo simulation, from the costs benchmarks/mttr.py (or ftcomm-report) measured.

    ftcomm-goodput sweep --costs results/mttr/mttr.json --size 10M          # 8 .. 100,000 ranks
    ftcomm-goodput sweep --costs mttr.json --world-sizes 10000 --node-mtbf-h 1250 --restart-s 600
    ftcomm-goodput predict --costs REPORT/costs.json --world-size 4 --steps 44 --failures 3 \\
        --policy spares --measured REPORT/summary.json

``sweep`` writes OUT/goodput.json and OUT/goodput.png (default OUT: results/goodput) and prints
the tables; ``predict`` prints one run's predicted goodput (and its difference from the measured
one). docs/GOODPUT.md describes the model, its inputs and its assumptions.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from .inputs import Cluster, Costs, Policy
from .predict import predict_run
from .sweep import WORLD_SIZES, draw_sweep, format_sweep, run_sweep
from .timeline import require_matplotlib

_OVERRIDES = ("step_s", "replication_share", "detection_s", "agree_shrink_s", "rebuild_s", "redo_s", "pre_failure_s",
              "checkpoint_s", "restart_s", "disk_restore_s", "warm_restart_s", "torchft_recover_s", "torchft_rejoin_s",
              "torchft_overhead_share")
_BOTH_POLICIES = ("detection_s", "agree_shrink_s", "rebuild_s", "redo_s")


def _cost_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--costs", required=True, metavar="JSON",
                   help="benchmarks/mttr.py's mttr.json or ftcomm-report's costs.json")
    p.add_argument("--size", help="which entry of the JSON's results (mttr.py: 1M, 10M, 100M; default the last)")
    g = p.add_argument_group("costs given instead of (or missing from) the JSON, in seconds (shares: 0-1); "
                             "a recovery phase given here holds for shrink and spares alike")
    for name in _OVERRIDES:
        g.add_argument("--" + name.replace("_", "-"), type=float, metavar="X")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("world sizes must be positive")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ftcomm-goodput", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sweep", help="ETTR against world size, disk-fallback probability per k, recommendations")
    _cost_options(s)
    s.add_argument("--world-sizes", type=_ints, default=list(WORLD_SIZES), metavar="N,N,...")
    s.add_argument("--ranks-per-node", type=int, default=8)
    s.add_argument("--node-mtbf-h", type=float, default=1250.0,
                   help="mean hours between failure events per node (default 1250: one per hour at 10,000 ranks)")
    s.add_argument("--correlated-fraction", type=float, default=0.0,
                   help="share of events that take down a group of --correlated-nodes consecutive nodes")
    s.add_argument("--correlated-nodes", type=int, default=4)
    s.add_argument("--fatal-fraction", type=float, default=0.0,
                   help="share of events that end the whole job (a node crash with Open MPI 5.0.x)")
    s.add_argument("--k", type=int, default=1, help="buddies per shard")
    s.add_argument("--spare-fraction", type=float, default=0.01, help="spare nodes per job node (ceil)")
    s.add_argument("--spare-nodes", type=int, help="a fixed number of spare nodes instead")
    s.add_argument("--regrow-below", type=float, help="planned restart below this share of the nodes (default: "
                                                      "1 - sqrt(2 (C + R) / node MTBF))")
    s.add_argument("--disk-interval-s", type=float, help="ftcomm's disk checkpoint interval (default the optimum for "
                                                         "the events that need the disk)")
    s.add_argument("--replica-group-nodes", type=int, default=1, help="torchft: nodes per replica group")
    s.add_argument("--horizon-days", type=float, default=30.0, help="length of each simulated run")
    s.add_argument("--trials", type=int, default=64, help="simulated runs per world size and strategy")
    s.add_argument("--disk-trials", type=int, default=2000, help="simulated days per world size and k")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="results/goodput")
    s.add_argument("--no-plot", action="store_true")

    r = sub.add_parser("predict", help="one run's goodput with a known number of failures")
    _cost_options(r)
    r.add_argument("--world-size", type=int, required=True)
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--failures", type=int, required=True)
    r.add_argument("--policy", choices=("shrink", "spares"), default="spares")
    r.add_argument("--k", type=int, help="buddies per shard (default: the JSON's replicas, else 1)")
    r.add_argument("--ranks-per-failure", type=int, default=1)
    r.add_argument("--measured", metavar="SUMMARY_JSON", help="ftcomm-report's summary.json of the run: print the "
                                                              "difference")
    return p.parse_args(argv)


def _costs(args, require_disk: bool = True) -> Costs:
    overrides = {name: getattr(args, name) for name in _OVERRIDES}
    for phase in _BOTH_POLICIES:  # a phase given on the command line holds for both policies
        if overrides[phase] is not None:
            overrides["spares_" + phase] = overrides[phase]
    return Costs.from_json(args.costs, args.size, require_disk, **overrides)


def sweep(args) -> int:
    if not args.no_plot:
        require_matplotlib()
    costs = _costs(args)
    base = Cluster(world_size=1, ranks_per_node=args.ranks_per_node, node_mtbf_s=args.node_mtbf_h * 3600,
                   correlated_fraction=args.correlated_fraction, correlated_nodes=args.correlated_nodes,
                   fatal_fraction=args.fatal_fraction)
    policy = Policy(k=args.k, regrow_below=args.regrow_below, disk_interval_s=args.disk_interval_s,
                    replica_group_nodes=args.replica_group_nodes)
    with tqdm(total=6, desc="ftcomm-goodput", unit="part", file=sys.stderr) as bar:
        def progress(msg):
            bar.set_postfix_str(msg)
            bar.update(1)

        result = run_sweep(base, costs, policy, world_sizes=args.world_sizes, spare_fraction=args.spare_fraction,
                           spare_nodes=args.spare_nodes, horizon_s=args.horizon_days * 86400, trials=args.trials,
                           disk_trials=args.disk_trials, seed=args.seed, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "goodput.json").write_text(json.dumps(result, indent=2))
    print(f"inputs: {costs.source}; node MTBF {args.node_mtbf_h:g} h, {args.ranks_per_node} ranks/node, k={args.k}, "
          f"correlated {args.correlated_fraction:g} x {args.correlated_nodes} nodes, fatal {args.fatal_fraction:g}")
    print(", ".join(f"{k} {v:.4g}" for k, v in costs.as_dict().items() if isinstance(v, float)))
    print(format_sweep(result))
    print(f"Monte Carlo: {result['timing_s']['ettr_monte_carlo']:.1f} s for ETTR, "
          f"{result['timing_s']['disk_monte_carlo']:.1f} s for the disk fallback")
    written = [out / "goodput.json"]
    if not args.no_plot:
        draw_sweep(result, out / "goodput.png")
        written.append(out / "goodput.png")
    print("wrote " + ", ".join(map(str, written)))
    return 0


def predict(args) -> int:
    costs = _costs(args, require_disk=False)  # a run without disk fallback reads none of them
    k = args.k
    if k is None:
        k = json.loads(Path(args.costs).read_text()).get("replicas") or 1
    pred = predict_run(costs, args.world_size, args.steps, args.failures, args.policy, k, args.ranks_per_failure)
    print(f"inputs: {costs.source}: step {costs.step_s * 1e3:.3f} ms, replication {k} x {costs.replication_share:.4f}, "
          f"stall per failure {pred['stall_per_failure_s'] * 1e3:.1f} ms")
    print(f"predicted: wall {pred['wall_s']:.3f} s (steps {pred['steps_s']:.3f} + failures {pred['failures_s']:.3f}), "
          f"ideal {pred['ideal_s']:.3f} s, goodput {pred['goodput']:.4f}")
    if args.measured:
        measured = json.loads(Path(args.measured).read_text())
        g = measured["goodput"]
        print(f"measured: wall {measured['wall_s']:.3f} s, goodput {g:.4f}; prediction - measured = "
              f"{pred['goodput'] - g:+.4f} ({(pred['goodput'] - g) / g:+.1%} of the measured)")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return sweep(args) if args.command == "sweep" else predict(args)
    except ImportError as err:
        print(f"ftcomm-goodput: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"ftcomm-goodput: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
