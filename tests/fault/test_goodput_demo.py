"""ftcomm-report on the logs of a real failure-injected run of the digits demo, and the goodput
model's prediction for that run against what the report measured."""
import importlib.util
import json
import subprocess
import sys

import pytest

from ftcomm.goodput.inputs import Costs
from ftcomm.goodput.logs import read_jsonl
from ftcomm.goodput.predict import predict_run
from harness import REPO, run_job

pytestmark = pytest.mark.fault


def test_report_of_a_demo_run_with_two_kills(tmp_path):
    logs = tmp_path / "logs"
    # no --policy: in a job with spares the elastic driver promotes them (none is left idle)
    res = run_job(REPO / "examples" / "train_digits.py", 4, "--epochs", "3",
                  "--kill", "1@15", "--kill", "2@40", "--no-progress", "--log-dir", logs,
                  env={"FTCOMM_TIMEOUT": "30"}, timeout=240, launcher_args=("--spares", "2"))
    assert res.returncode == 0, res.describe()
    demo = json.loads(next(l for l in res.stdout.splitlines() if l.startswith("SUMMARY "))[len("SUMMARY "):])
    out = tmp_path / "report"
    plot = importlib.util.find_spec("matplotlib") is not None  # the bench and demo extras install it
    proc = subprocess.run([sys.executable, "-m", "ftcomm.goodput.report_cli", str(logs), "--out", str(out),
                           *([] if plot else ["--no-plot"])],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["initial_size"], summary["final_size"], summary["policy"], summary["replicas"]) == (4, 4, "spares", 1)
    assert summary["steps"] == demo["steps"] == 66 and summary["redone_steps"] == demo["redone_steps"] == 2
    assert summary["ranks"] == [0, 1, 2, 3, 4, 5]
    failures = summary["failures"]
    assert [(f["step"], f["lost_world_ranks"], f["fail_time_from"]) for f in failures] == \
        [(15, [1], "kill event"), (40, [2], "kill event")]
    for f, d in zip(failures, demo["mttr"]):
        assert 0 < f["detection_s"] < f["mttr_s"] < 10 and f["rebuild_s"] > 0 and f["redo_s"] > 0
        # the demo measures kill -> the first commit of any rank, the report kill -> rank 0's
        assert f["mttr_s"] == pytest.approx(d["mttr_s"], abs=0.05)
    assert 0 < summary["lost_s"] < summary["wall_s"] and 0 < summary["goodput"] < 1
    assert not plot or (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the model, given this run's measured costs, predicts its goodput within 10%
    costs = Costs.from_json(out / "costs.json", require_disk=False)
    predicted = predict_run(costs, 4, summary["steps"], len(failures), "spares")["goodput"]
    assert predicted == pytest.approx(summary["goodput"], rel=0.10), (predicted, summary["goodput"])


def _events(logs, name):
    """Every rank's logged events called ``name`` (the report's own reader)."""
    return [e for path in sorted(logs.glob("*.jsonl")) for e in read_jsonl(path) if e["event"] == name]


def test_report_of_a_ddp_run_with_a_kill_and_a_spare(tmp_path):
    """The DDP example's logs (``resilient(..., log_path=)``) give the same report: the failure
    timed from the victim's kill event, the survivors' recovery, the spare's join, the first
    commit after it. ``--kill 2@30`` is step 30 everywhere: the kill, the recovery, the redone
    step's commit, the example's JSON and the report (steps counted from 1)."""
    logs = tmp_path / "logs"
    res = run_job(REPO / "examples" / "ddp_train.py", 4, "--epochs", "4", "--kill", "2@30", "--log-dir", logs,
                  "--result-json", tmp_path / "result.json", timeout=240, launcher_args=("--spares", "1"))
    assert res.returncode == 0, res.describe()
    result = json.loads((tmp_path / "result.json").read_text())
    assert [k["step"] for k in _events(logs, "kill")] == [30]
    assert {(e["rank"], e["step"]) for e in _events(logs, "recovered")} == {(0, 30), (1, 30), (3, 30)}
    assert [(e["rank"], e["step"]) for e in _events(logs, "joined")] == [(4, 30)]
    assert {e["step"] for e in _events(logs, "first_commit")} == {30}
    assert [e["step"] for e in result["recoveries"]] == [30]
    plot = importlib.util.find_spec("matplotlib") is not None
    proc = subprocess.run([sys.executable, "-m", "ftcomm.goodput.report_cli", str(logs), "--out",
                           str(tmp_path / "report"), *([] if plot else ["--no-plot"])],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert (summary["initial_size"], summary["final_size"], summary["policy"]) == (4, 4, "spares")
    assert summary["ended"] is True and summary["ranks"] == [0, 1, 2, 3, 4]
    assert summary["steps"] == result["steps"] and summary["redone_steps"] == result["redone_steps"] == 1
    [failure] = summary["failures"]
    assert (failure["step"], failure["lost_world_ranks"], failure["fail_time_from"]) == (30, [2], "kill event")
    assert 0 < failure["detection_s"] < failure["mttr_s"] < 10 and failure["redo_s"] > 0
