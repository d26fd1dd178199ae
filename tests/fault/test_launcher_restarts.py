"""`ftcomm-run --restarts N` on whole jobs, and ftcomm-run stopped by a signal.

- A fake node's PRRTE daemon dies after the first committed step (Open MPI 5.0.x then ends the
  whole job): ftcomm-run relaunches on the other node only, with as many ranks as it holds and
  FTCOMM_RESTART=1, and the relaunch finishes.
- The program's own error on every rank, or a failure before any committed step: no relaunch,
  exit status 70 at once.
- SIGTERM, SIGINT, SIGHUP to ftcomm-run: it ends the job and exits with 128+N; SIGKILL: mpirun
  and every rank end all the same. Either way nothing of the job is left 15 s later.

Every process of a job is found by a marker: in its command line (mpirun, the ranks) or in its
environment (the fake nodes' daemons, whose command line does not name the program).
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness import JOBS, REPO, job_environment, live_processes, parse_reports, run_job

JOB = JOBS / "restart_job.py"
WOULD_REPEAT = 70  # ftcomm.launch.verdict.WOULD_REPEAT
LEFTOVER_S = 15.0


def _job_processes(marker: str) -> list[str]:
    """Running processes (zombies aside) whose command line or environment holds ``marker``."""
    return [f"{pid} {_words(cmdline)}" for pid, cmdline, environ in live_processes()
            if marker.encode() in cmdline or f"JOB_MARKER={marker}".encode() in environ.split(b"\0")]


def _words(cmdline: bytes) -> str:
    return cmdline.replace(b"\0", b" ")[:120].decode(errors="replace")


def _assert_nothing_left(marker: str, limit_s: float = LEFTOVER_S) -> None:
    deadline = time.monotonic() + limit_s
    while _job_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _job_processes(marker)
    for line in left:  # never leave a job behind, even when the test fails
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    assert not left, f"left running: {left}"


def _hostfile(tmp_path) -> list[str]:
    path = tmp_path / "hosts"
    path.write_text("n1 slots=2\nn2 slots=2\n")
    return ["--hostfile", str(path), "--fake-nodes", "--ranks-per-node", "2"]


def test_a_lost_node_is_relaunched_on_the_other_with_fewer_ranks(tmp_path):
    marker = f"restart-{uuid.uuid4().hex[:8]}"
    res = run_job(JOB, 4, marker, "node-loss", timeout=120, env={"JOB_MARKER": marker, "FTCOMM_FINALIZE_TIMEOUT": 5},
                  launcher_args=[*_hostfile(tmp_path), "--restarts", "2", "--restart-backoff", "0.2"])
    try:
        assert res.returncode == 0, res.describe()
        first = [r for r in res.reports if r["event"] == "start" and r["restart"] == 0]
        assert sorted(r["node"] for r in first) == ["n1", "n1", "n2", "n2"], res.describe()
        assert "relaunch 1 of 2 in 0.2 s on hosts n1 (2 ranks)" in res.stderr, res.describe()
        assert "lost host(s) n2" in res.stderr and "hold 2 ranks, not 4 ranks" in res.stderr, res.describe()
        again = [r for r in res.reports if r["event"] == "start" and r["restart"] == 1]
        assert sorted(r["node"] for r in again) == ["n1", "n1"] and {r["size"] for r in again} == {2}, res.describe()
        done = res.by_rank(event="done")
        assert set(done) == {0, 1} and all(d["restart"] == 1 and d["size"] == 2 for d in done.values())
        assert "relaunch 2" not in res.stderr and "exit status 0 after 1 relaunch(es)" in res.stderr
    finally:
        _assert_nothing_left(marker)


@pytest.mark.parametrize("mode, reason", [
    ("raise", "an uncaught exception on world rank(s) [0, 1, 2]"),
    ("bad-args", "exit status 2 on world rank(s) [0, 1, 2]"),
    ("die-early", "the job failed before its first committed step"),
], ids=["raise", "bad-args", "die-early"])
def test_a_failure_that_would_repeat_is_not_relaunched(mode, reason):
    marker = f"repeat-{uuid.uuid4().hex[:8]}"
    res = run_job(JOB, 3, marker, mode, timeout=60, env={"JOB_MARKER": marker},
                  launcher_args=["--restarts", "3", "--restart-backoff", "0.2"])
    try:
        assert res.returncode == WOULD_REPEAT, res.describe()
        assert "not relaunching" in res.stderr and reason in res.stderr, res.describe()
        assert "relaunch 1" not in res.stderr, res.describe()
        assert {r["restart"] for r in res.reports if r["event"] == "start"} == {0}, res.describe()
    finally:
        _assert_nothing_left(marker)


def _stop_signals_at(ignored: tuple):
    """A preexec_fn: in the child before exec, the stop signals at their default disposition but
    ``ignored``. Never inherited: a shell starts a background job (``cmd &``) with SIGINT ignored,
    and ``nohup`` ignores SIGHUP, and ftcomm-run keeps an ignored signal ignored."""
    def preexec() -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
    return preexec


def _start_hanging_job(marker: str, ignored: tuple = ()) -> subprocess.Popen:
    """ftcomm-run with 3 ranks of hang_forever.py (rank 1 sleeps, the others wait in MPI_Finalize),
    started with the stop signals in ``ignored`` ignored, returned once every rank has reported."""
    env = job_environment({"FTCOMM_FINALIZE_TIMEOUT": 120, "JOB_MARKER": marker})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "ftcomm.launch", "-n", "3", "--timeout", "120", sys.executable,
                             str(JOBS / "hang_forever.py"), marker], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, text=True, preexec_fn=_stop_signals_at(ignored))
    seen = []
    deadline = time.monotonic() + 90
    while len(seen) < 3 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += [r for r in parse_reports(line) if r.get("started")]
    assert len(seen) == 3, f"the job did not start: {seen} {proc.poll()}"
    return proc


@pytest.mark.fault
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_launcher_ends_the_whole_job(signum):
    marker = f"signal-{uuid.uuid4().hex[:8]}"
    proc = _start_hanging_job(marker)
    try:
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        if signum == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 128 + signum, err
            assert f"{signal.Signals(signum).name}: ended the job" in err, err
            assert took < 10, f"ftcomm-run took {took:.1f} s to end the job"
    finally:
        proc.kill()
        _assert_nothing_left(marker)


@pytest.mark.fault
def test_a_signal_ignored_when_the_launcher_starts_stays_ignored():
    # as under ``nohup ftcomm-run ...``: SIGHUP ignored; SIGTERM still ends the job
    marker = f"nohup-{uuid.uuid4().hex[:8]}"
    proc = _start_hanging_job(marker, ignored=(signal.SIGHUP,))
    try:
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        assert len(_job_processes(marker)) >= 4, _job_processes(marker)  # ftcomm-run, mpirun, ranks
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "SIGTERM: ended the job" in err and "SIGHUP" not in err, err
    finally:
        proc.kill()
        _assert_nothing_left(marker)
