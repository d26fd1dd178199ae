"""ftcomm-check (ftcomm/selfcheck.py): the install's self-check runs its 4-rank job and says
each check worked; and its verdicts fail a check whose evidence is missing or wrong."""
import subprocess
import sys

import pytest

from ftcomm import selfcheck
from harness import REPO, job_environment


@pytest.mark.timeout(300)
def test_the_self_check_passes_here_and_says_what_it_tried():
    res = subprocess.run([sys.executable, "-m", "ftcomm.selfcheck"], capture_output=True, text=True,
                         env=job_environment(), timeout=280, cwd=REPO / "tests", stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = {line.split()[1]: line for line in res.stdout.splitlines()[1:] if line.strip()}
    for check in ("MPI", "allreduce", "bad", "torch", "recovery", "fencing"):
        assert lines[check].split()[0] == "ok", res.stdout
    assert "ULFM on" in lines["MPI"] and "fenced" in lines["fencing"] and "info" in lines["CUDA"]


def _good() -> dict:
    every = {w: {"world_rank": w, "ft": True, "ulfm": "Open MPI runs with ULFM on", "cuda": "none",
                 "allreduce_exact": True, "bad_input": "InvalidInputError: world rank 1 passed 65543 elements",
                 "torch": "torch 2.x", "torch_exact": True} for w in range(4)}
    for w in (0, 1, 2):
        every[w].update(recovery_exact=True, recovery_members=[0, 1, 2], recovery_error="ProcFailedError: x")
    for w in (0, 1):
        every[w].update(fencing_exact=True, fencing_members=[0, 1], fencing_error="ProcFailedError: fenced")
    return every


def test_verdicts_fail_what_the_ranks_did_not_show():
    assert all(ok is not False for _, ok, _ in selfcheck._verdicts(_good()))
    bad = _good()
    bad[2]["bad_input"] = "no error"  # one rank went on as if nothing happened
    bad[1]["fencing_members"] = [0, 1, 2]  # the stopped rank was not left out
    del bad[3]["torch_exact"]  # a rank never finished the torch check
    verdict = {check: ok for check, ok, _ in selfcheck._verdicts(bad)}
    assert verdict["bad input"] is False and verdict["fencing"] is False and verdict["torch backend"] is False
    assert verdict["recovery"] is True and verdict["allreduce"] is True
    nothing = {check: ok for check, ok, _ in selfcheck._verdicts({})}
    assert not any(nothing[c] for c in ("MPI", "allreduce", "bad input", "recovery", "fencing"))
