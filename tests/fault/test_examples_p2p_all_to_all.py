"""The pipeline-parallel example (examples/pipeline_train.py: stages over send/recv) and the
mixture-of-experts example (examples/moe_all_to_all.py: tokens routed by all_to_all_single) with a
rank killed mid-step: the survivors re-split the work, run the step again, and end where a run
without the kill ends."""
import json

import pytest

from harness import REPO, run_job

pytest.importorskip("torch")
pytest.importorskip("sklearn")


@pytest.mark.fault
@pytest.mark.timeout(240)
def test_pipeline_example_restarts_the_step_on_fewer_stages_and_ends_as_without_the_kill(tmp_path):
    results = {}
    for name, kill in (("clean", []), ("killed", ["--kill", "1@40"])):
        out = tmp_path / f"{name}.json"
        job = run_job(REPO / "examples" / "pipeline_train.py", 3, *kill, "--result-json", out, timeout=100)
        assert job.returncode == 0, job.describe()
        results[name] = json.loads(out.read_text())
    assert results["clean"]["restarts"] == [] and results["clean"]["stages"] == 3
    assert results["killed"]["restarts"] == [{"step": 40, "error": "ProcFailedError", "stages": 2}]
    assert results["killed"]["stages"] == 2
    # the step run again from the committed model: the same updates, so the same model at the end
    assert results["killed"]["accuracy"] == pytest.approx(results["clean"]["accuracy"], abs=1e-6)
    assert results["clean"]["accuracy"] >= 0.85


@pytest.mark.fault
@pytest.mark.timeout(200)
def test_moe_example_reassigns_the_experts_and_matches_the_local_reference():
    job = run_job(REPO / "examples" / "moe_all_to_all.py", 4, "--kill", "2@5", timeout=100)
    assert job.returncode == 0, job.describe()
    assert "step 5: ProcFailedError; running it again over 3 ranks" in job.stdout, job.describe()
    line = next(line for line in job.stdout.splitlines() if "largest difference" in line)
    assert "over 3 ranks, 1 step(s) run again" in line, line
    assert float(line.rsplit(" ", 1)[1]) <= 1e-5, line
