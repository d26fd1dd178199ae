"""Runs tests of torch's own backend suite (``DistributedTest._DistTestBase`` in
torch/testing/_internal/distributed/distributed_test.py) on a backend under ftcomm-run, through the
job tests/jobs/torch_suite.py, and sums up each test's outcome over the ranks.

A job runs several tests one after another (``tests_per_job``; 1: a fresh job per test, as torch's
own runner gives each test fresh processes). A test that hangs past the deadline, or a job that
ends before a test reported, costs that test a "hang" or "crash"; the tests after it go on in a
new job.
"""
from __future__ import annotations

import collections
import tempfile

from harness import JOBS, run_job

JOB = JOBS / "torch_suite.py"
OUTCOMES = ("pass", "fail", "error", "skip", "hang", "crash")


def suite_tests() -> list[str]:
    """Every test of ``DistributedTest._DistTestBase`` as the class holds it (parametrized tests
    get their names when the module is imported), in its order."""
    with tempfile.TemporaryDirectory(prefix="ftcomm-torch-suite-") as temp_dir:
        job = run_job(JOB, 1, "--backend", "gloo", "--temp-dir", temp_dir, "--list", timeout=120)
    listed = [rep["names"] for rep in job.reports if rep["kind"] == "tests"]
    assert job.returncode == 0 and listed, job.describe()
    return listed[0]


def _combined(outcomes: list[str]) -> str:
    """One test's outcome from its ranks': an error or failure on any rank is the test's; a skip
    anywhere (torch's skips are decided alike on every rank) skips it."""
    for worst in ("error", "fail", "skip"):
        if worst in outcomes:
            return worst
    return "pass"


def run(backend: str, n: int, tests: list[str], tests_per_job: int, deadline_s: float = 120.0,
        env: dict | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Runs ``tests`` at ``n`` ranks on ``backend`` ("ftcomm" or "gloo"). Returns (outcome per
    test, one of OUTCOMES; the first message of a test that did not pass or skip)."""
    outcomes, messages = {}, {}
    pending = list(tests)
    while pending:
        batch, pending = pending[:tests_per_job], pending[tests_per_job:]
        with tempfile.TemporaryDirectory(prefix="ftcomm-torch-suite-") as temp_dir:
            job = run_job(JOB, n, "--backend", backend, "--temp-dir", temp_dir, "--deadline", deadline_s, *batch,
                          env=env, timeout=deadline_s + 60 + 30 * len(batch))
        per_test = collections.defaultdict(dict)
        for rep in job.reports:
            if rep["kind"] == "result":
                per_test[rep["test"]][rep["world_rank"]] = rep
        hung = {rep["test"] for rep in job.reports if rep["kind"] == "hang"}
        for index, name in enumerate(batch):
            reps = per_test.get(name, {})
            if len(reps) < n:  # the job ended in this test: the rest go on in a new job
                outcomes[name] = "hang" if name in hung else "crash"
                messages[name] = job.describe()[-3000:]
                pending = batch[index + 1:] + pending
                break
            outcomes[name] = _combined([r["outcome"] for r in reps.values()])
            if outcomes[name] not in ("pass", "skip"):
                messages[name] = next(r["message"] for r in reps.values() if r["outcome"] == outcomes[name])
    return outcomes, messages


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    """How many tests had each outcome."""
    tally = collections.Counter(outcomes.values())
    return {outcome: tally.get(outcome, 0) for outcome in OUTCOMES}
