"""torch's own backend suite (distributed_test.py) on ftcomm beside gloo: every test, at the given
world sizes, a fresh job per test or several tests per job; prints each backend's counts and every
test whose outcome differs, and writes the outcomes as JSON.

    python scripts/torch_suite.py --ranks 2 3 --tests-per-job 300 --out torch_suite.json
    python scripts/torch_suite.py --ranks 3 --tests-per-job 1       # a fresh job per test (slow)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import torch_suite_runner as runner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--tests-per-job", type=int, default=300, help="1: a fresh job per test")
    parser.add_argument("--backends", nargs="+", default=["gloo", "ftcomm"])
    parser.add_argument("--only", nargs="*", help="these tests only (default: all)")
    parser.add_argument("--out", type=Path, help="the outcomes, as JSON")
    args = parser.parse_args()
    tests = args.only or runner.suite_tests()
    results = {}
    for n in args.ranks:
        for backend in args.backends:
            start = time.monotonic()
            outcomes, messages = runner.run(backend, n, tests, args.tests_per_job)
            results[f"{backend}@{n}"] = {"outcomes": outcomes, "messages": messages,
                                         "seconds": round(time.monotonic() - start)}
            print(f"{backend:7s} {n} ranks: {runner.counts(outcomes)} in {time.monotonic() - start:.0f} s", flush=True)
        if {"gloo", "ftcomm"} <= set(args.backends):
            gloo, ours = results[f"gloo@{n}"]["outcomes"], results[f"ftcomm@{n}"]["outcomes"]
            for name in tests:
                if gloo[name] != ours[name]:
                    message = results[f"ftcomm@{n}"]["messages"].get(name, "")
                    print(f"  {n} ranks {name}: gloo {gloo[name]}, ftcomm {ours[name]} {message[:300]!r}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
