"""Runs the pytest-mpi suite the way users of this field run an MPI test suite:
``ftcomm-run -n 4 python -m pytest --with-mpi tests/mpi``, under a hard timeout."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pytest_mpi_suite_passes_at_4_ranks():
    cmd = [sys.executable, "-m", "ftcomm.launch", "-n", "4", "--timeout", "300",
           sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "tests/mpi"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=330,
                          stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" passed") >= 4, proc.stdout[-3000:]
    assert " failed" not in proc.stdout
