"""ftcomm-report: the recovery report of one run, from its JSON-lines event logs.

    ftcomm-report results/train_digits              # the newest run in the directory
    ftcomm-report results/train_digits --run 12345  # the run whose files start with 12345.
    ftcomm-report LOGDIR --out report --no-plot     # summary and JSON only

Prints the summary (failures, MTTR and its phases, steps redone, time lost, goodput) and writes
OUT/timeline.png, OUT/summary.json and OUT/costs.json (the measured costs in benchmarks/mttr.py's
layout, for ``ftcomm-goodput --costs``). OUT defaults to LOGDIR/report-RUN.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .logs import load_run
from .summary import costs, format_summary, summarize
from .timeline import draw, require_matplotlib


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ftcomm-report", description=__doc__.split("\n\n")[0])
    p.add_argument("logdir", help="directory of the run's *rankN.jsonl event logs")
    p.add_argument("--run", help="the run's file-name prefix (default: the newest run in LOGDIR)")
    p.add_argument("--out", help="where the picture and JSON go (default LOGDIR/report-RUN)")
    p.add_argument("--no-plot", action="store_true", help="no timeline picture (no matplotlib needed)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_plot:
        try:
            require_matplotlib()
        except ImportError as err:
            print(f"ftcomm-report: {err}", file=sys.stderr)
            return 2
    try:
        run = load_run(args.logdir, args.run)
        summary = summarize(run)
    except (FileNotFoundError, ValueError) as err:
        print(f"ftcomm-report: {err}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else Path(args.logdir) / f"report-{run.run_id.rstrip('.') or 'run'}"
    out.mkdir(parents=True, exist_ok=True)
    print(format_summary(summary))
    (out / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    (out / "costs.json").write_text(json.dumps(costs(summary), indent=2))
    written = [out / "summary.json", out / "costs.json"]
    if not args.no_plot:
        draw(run, summary, out / "timeline.png")
        written.insert(0, out / "timeline.png")
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
