"""scripts/gpu_check.sh --cpu-dry-run: the GPU check's phases on CPU, so that the script itself is
tested where no GPU is. Its test phases are files of tests/gpu, which the suite runs on CPU: the dry
run only collects them (a missing file or a broken import fails it), but for two DDP-on-device jobs
that the suite skips without a GPU, which it runs on CPU; its benchmark job runs."""
import json
import subprocess
import sys
from pathlib import Path

from harness import job_environment

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_runs_every_phase_and_writes_the_summary(tmp_path):
    env = job_environment({"OUT": str(tmp_path), "PYTHON": sys.executable})
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu-dry-run"], env=env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert proc.returncode == 0 and summary["all_ok"], proc.stdout[-4000:] + proc.stderr[-2000:]
    assert summary["dry_run"] is True
    log = (tmp_path / "gpu_check.log").read_text()
    assert "2 passed, 5 deselected" in log, log[-4000:]  # the DDP-on-device kill and spare, on CPU
    assert set(summary["phases"]) == {"import", "test_kernels", "test_allreduce_gpu", "test_staging_host",
                                      "test_torch_staging", "test_ddp_device", "test_nccl_plane",
                                      "bench_backends_n4"}
    assert summary["nccl_plane"] is None and "fewer than 2 GPUs" in proc.stdout, summary  # one GPU per rank
    bench = summary["backends"]
    assert bench["device"] == "cpu" and [r["mib"] for r in bench["allreduce"]] == [1, 4]
    assert all(r["values_ok"] and r["ftcomm"]["busbw_gb_s"] > 0 and r["gloo"]["busbw_gb_s"] > 0
               for r in bench["allreduce"]), bench
    assert set(bench["ddp"]) == {"ftcomm", "gloo"} and "nccl" in bench["skipped"], bench
