"""A script started without ftcomm-run (one process, no ULFM) that asks for a failure says so
instead of running silently as if nothing had been asked: the demos' --kill refuses to run, and
fault injection or a recovery policy is named once on stderr."""
import subprocess
import sys

from harness import REPO, job_environment

MESSAGE = "needs a job that can recover from a failure, and this one cannot"


def _python(*args, timeout=180):
    env = {k: v for k, v in job_environment().items() if not k.startswith("FTCOMM_")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=REPO, stdin=subprocess.DEVNULL)


def test_the_demo_refuses_a_kill_it_cannot_survive():
    res = _python("examples/train_digits.py", "--kill", "2@40", "--no-progress")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count(MESSAGE) == 1 and "--kill" in res.stderr and "ftcomm-run" in res.stderr
    assert "test accuracy" not in res.stdout  # it did not train


def test_fault_injection_and_a_recovery_policy_are_named_once():
    code = ("import ftcomm\n"
            "for step in (3, 4):\n"
            "    ftcomm.fault.inject('train_step', rank=1, step=step)\n"
            "ftcomm.fault.clear()\n"
            "print(ftcomm.fault.can_recover('spares'), ftcomm.fault.can_recover('spares'))\n")
    res = _python("-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False"]
    assert res.stderr.count("fault injection (kill at train_step) " + MESSAGE) == 1
    assert res.stderr.count("spares " + MESSAGE) == 1
