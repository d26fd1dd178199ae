"""The CI legs name tests by node id (.ci/mpich, .ci/torch-newest): a renamed test or a changed
parameter id makes pytest stop with "not found" at the end of a 45-minute run. Every id a leg
names must be collected here first."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEGS = [".ci/mpich", ".ci/torch-newest"]


def _node_ids(leg: str) -> list[str]:
    """The ``tests/...py::name[id]`` words of a leg's script, quoted or not."""
    text = (REPO / leg).read_text()
    return sorted(set(re.findall(r'(tests/[\w/]+\.py::\w+(?:\[[^\]]*\])?)', text)))


@pytest.mark.parametrize("leg", LEGS)
def test_every_node_id_a_ci_leg_names_is_collected(leg):
    ids = _node_ids(leg)
    assert ids, f"{leg} names no test by node id: this test's pattern is out of date"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{leg}: pytest could not collect\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
