"""`ftcomm-run --timeout` ends a job with a hung rank: exit status 124 and no rank left behind,
even though Open MPI starts ranks outside the launcher's process group."""
import os
import subprocess
import time
import uuid

import pytest

from harness import JOBS, run_job


def _running(pid: int) -> bool:
    """True if the process exists and is not a zombie (killed, waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.fault
def test_timeout_kills_every_rank_of_a_hung_job():
    marker = f"hang-{uuid.uuid4().hex[:8]}"
    job = run_job(JOBS / "hang_forever.py", 3, marker, timeout=15, env={"FTCOMM_FINALIZE_TIMEOUT": 60})
    assert job.returncode == 124, job.describe()
    pids = [r["pid"] for r in job.reports if r.get("started")]
    assert len(pids) == 3, job.describe()
    time.sleep(1.0)
    alive = [pid for pid in pids if _running(pid)]
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in alive + [int(p) for p in leftovers]:
        os.kill(pid, 9)
    assert alive == [] and leftovers == [], f"ranks left behind: {alive} {leftovers}"
