"""`ftcomm-run --restarts` and the launcher's clean-up, without MPI: host bookkeeping (lost host
dropped, spare host taken, fewer ranks when hosts are short, a Slurm allocation's hosts with a
fake scontrol), the rules that stop a relaunch, the daemon session records, the signals, the
rank-side launcher watch, and the relaunch loop itself with a fake mpirun."""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ftcomm import settings
from ftcomm.launch import command, hosts, processes, run, sessions, verdict
from ftcomm.launch.hosts import Host
from ftcomm.launch.signals import StopSignals

SCRIPT = command.config_dir() / "daemon_session.sh"


# -- hosts --------------------------------------------------------------------------------------
def test_hostfile_hosts_in_order_with_their_slots(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two nodes and a spare\nn1 slots=2\nn2 slots=2 max_slots=4  # busy\n\nn3\nn1 slots=1\n")
    assert hosts.read_hostfile(str(path)) == [Host("n1", 3), Host("n2", 2), Host("n3", None)]
    path.write_text("n1 slots=two\n")
    with pytest.raises(ValueError, match="hosts:1"):
        hosts.read_hostfile(str(path))


def test_a_lost_host_is_dropped_and_a_spare_host_taken_in():
    job = [Host("n1", 2), Host("n2", 2), Host("n3", 2)]  # -n 4 runs on n1 and n2; n3 is spare
    usable = hosts.usable_hosts(job, {"n2"})
    assert usable == [Host("n1", 2), Host("n3", 2)]
    assert hosts.fit_world(4, 0, hosts.capacity(usable, None)) == (4, 0)  # n3 makes up for n2
    assert hosts.usable_hosts(job, {"n2.cluster.example"}) == usable  # the daemon's host may be long


@pytest.mark.parametrize("ranks, spares, room, fitted", [
    (4, 0, 2, (2, 0)),      # hosts short: as many as they hold
    (4, 2, 5, (4, 1)),      # spares are given up first
    (4, 2, 6, (4, 2)),
    (4, 0, None, (4, 0)),   # slots unknown: -n stays
    (4, 0, 0, (0, 0)),
])
def test_the_world_shrinks_when_the_hosts_are_short(ranks, spares, room, fitted):
    assert hosts.fit_world(ranks, spares, room) == fitted


def test_capacity_from_slots_or_ranks_per_node():
    assert hosts.capacity([Host("a", 2), Host("b", 3)], None) == 5
    assert hosts.capacity([Host("a", 2), Host("b", None)], None) is None
    assert hosts.capacity([Host("a", None), Host("b", None)], 4) == 8


def test_hostfile_written_for_a_relaunch(tmp_path):
    hosts.write_hostfile([Host("n1", 2), Host("n3", None)], str(tmp_path / "h"))
    assert (tmp_path / "h").read_text() == "n1 slots=2\nn3\n"
    assert hosts.read_hostfile(str(tmp_path / "h")) == [Host("n1", 2), Host("n3", None)]


def fake_scontrol(tmp_path, monkeypatch, names):
    """An `scontrol` first on PATH that prints ``names`` for `show hostnames`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 1\nprintf "%s\\n" {" ".join(names)}\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_slurm_allocation_hosts_from_scontrol(tmp_path, monkeypatch):
    fake_scontrol(tmp_path, monkeypatch, ["n1", "n2", "n3"])
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_CPUS_PER_NODE": "4(x2),2"}
    assert hosts.slurm_hosts(env) == [Host("n1", 4), Host("n2", 4), Host("n3", 2)]
    env["SLURM_NTASKS_PER_NODE"] = "2"  # tasks per node, when given, count before the CPUs
    assert hosts.slurm_hosts(env) == [Host("n1", 2), Host("n2", 2), Host("n3", 2)]
    assert hosts.usable_hosts(hosts.slurm_hosts(env), {"n2"}) == [Host("n1", 2), Host("n3", 2)]
    assert hosts.slurm_hosts({}) is None  # outside Slurm
    assert hosts.expand_counts("72(x2),36") == [72, 72, 36]
    with pytest.raises(ValueError):
        hosts.expand_counts("72x2")


# -- the rules ----------------------------------------------------------------------------------
def rep(rank, exception=False, status=0, lost=(), failure=False):
    return {"world_rank": rank, "pid": 100 + rank, "lost": list(lost), "uncaught_exception": exception,
            "failure": failure, "exit_status": status}


def test_abnormal_ends():
    assert verdict.abnormal_end(0, [rep(0), rep(1)]) is None
    assert verdict.abnormal_end(0, [rep(0, lost=[1])]) is None  # recovered in the job: not abnormal
    assert verdict.abnormal_end(0, []) == "launcher status 0 but no rank finished"  # a daemon lost
    assert verdict.abnormal_end(1, [rep(0, exception=True)]) == "launcher status 1, no rank finished"
    assert verdict.abnormal_end(-9, [rep(0)]) == "launcher status -9"
    # A rank ended by an exception, the others recovered and finished: not abnormal.
    assert verdict.abnormal_end(1, [rep(0, exception=True), rep(1, lost=[0]), rep(2, lost=[0])]) is None


@pytest.mark.parametrize("reports, committed, lost, expected", [
    ([rep(0, exception=True), rep(1, exception=True)], True, set(), "an uncaught exception on world rank(s) [0, 1]"),
    ([rep(0, status=2), rep(1, status=2)], True, set(), "exit status 2 on world rank(s) [0, 1]"),
    ([rep(0, exception=True), rep(1, status=2)], True, set(), "the program's own error"),
    ([rep(0, status=2), rep(1, status=3)], True, set(), None),     # different statuses: not the program alone
    ([rep(0, exception=True), rep(1)], True, set(), None),          # a rank finished
    ([], True, set(), None),                                        # killed from outside after a commit
    ([], False, set(), "the job failed before its first committed step"),
    ([rep(0, exception=True)], False, {"n2"}, None),                # a lost host: the next launch differs
    # every survivor raised StateLostError (a shard lost with its buddies): a relaunch resumes from disk
    ([rep(0, exception=True, failure=True, lost=[1, 2]), rep(3, exception=True, failure=True, lost=[1, 2])],
     True, set(), None),
])
def test_failures_that_would_only_repeat(reports, committed, lost, expected):
    found = verdict.repeat_reason(reports, committed, lost)
    assert (found is None) if expected is None else (expected in found), found


def test_backoff_doubles_up_to_its_cap():
    assert [verdict.backoff(k, 1.0, 5.0) for k in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]


# -- daemon sessions ----------------------------------------------------------------------------
def record_session(tmp_path, agent_script, *, host_args=("-o", "X=y", "user@n7"), wait=True):
    """Runs daemon_session.sh with an agent `sh -c AGENT_SCRIPT` in a process group of its own,
    as PRRTE does; returns the process."""
    proc = subprocess.Popen([str(SCRIPT), str(tmp_path), "sh", "-c", agent_script, "agent", "--", *host_args,
                             "prted --args"], start_new_session=True)
    if wait:
        proc.wait(timeout=30)
    return proc


def wait_until_running(record_dir) -> None:
    """Until daemon_session.sh has started its agent (the record names the subshell)."""
    deadline = time.monotonic() + 30
    while not any(s.pid for s in sessions.read_sessions(str(record_dir))) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_session_records_its_host_and_how_its_agent_ended(tmp_path):
    proc = record_session(tmp_path, 'exit 3')
    assert proc.returncode == 3  # the agent's status goes back to PRRTE
    record_session(tmp_path, 'kill -9 $$')  # the daemon died: a lost host
    found = sorted(sessions.read_sessions(str(tmp_path)), key=lambda s: s.status)
    assert [(s.host, s.status) for s in found] == [("n7", 3), ("n7", 137)]
    assert sessions.lost_hosts(found) == {"n7"}
    assert sessions.lost_hosts([sessions.Session("n1", 1, 2, 1), sessions.Session("n2", 3, 4, 0)]) == set()


def test_a_session_is_recorded_even_when_prrte_kills_its_agent_script(tmp_path):
    """At an abnormal end PRRTE SIGKILLs the agent process it started: the status is written all
    the same, when the agent itself ends."""
    proc = record_session(tmp_path, 'sleep 1; exit 255', wait=False)
    wait_until_running(tmp_path)
    proc.kill()
    found = sessions.wait_for_ends(str(tmp_path), 10)
    assert [(s.host, s.status) for s in found] == [("n7", 255)]


def test_sessions_still_running_are_killed(tmp_path):
    proc = record_session(tmp_path, 'sleep 60', wait=False)
    wait_until_running(tmp_path)
    session = sessions.wait_for_ends(str(tmp_path), 0.2)[0]
    assert session.status is None and in_group(session.pgid)  # still running: the script, subshell, sleep
    sessions.kill_sessions(str(tmp_path))
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while in_group(session.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not in_group(session.pgid)


def in_group(pgid: int) -> list[int]:
    """Running processes (zombies aside) of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def test_agent_wraps_the_agent_that_would_be_used(capsys):
    cmd = dry_run(capsys, "-n", "4", "--restarts", "1", "--mca", "plm_rsh_agent", "ssh -q", "--hostfile", "h", "x")
    agents = [cmd[i + 2] for i, w in enumerate(cmd)
              if w == "--mca" and cmd[i + 1] in ("plm_rsh_agent", "plm_ssh_agent")]
    assert len(agents) == 1 and agents[0].startswith(str(SCRIPT)) and agents[0].endswith(" ssh -q --")
    cmd = dry_run(capsys, "-n", "4", "--hostfile", "h", "x")  # without --restarts: as before
    assert not any("daemon_session" in w for w in cmd)
    with pytest.raises(ValueError, match="colons"):
        command.agent_command("/tmp/x", "ssh : rsh")
    with pytest.raises(SystemExit) as exc:  # said at once, as a usage error
        run.main(["--dry-run", "--mpi", "openmpi", "-n", "2", "--restarts", "1", "--mca", "plm_rsh_agent", "ssh : rsh",
                  "x"])
    assert exc.value.code == 2 and "--restarts: " in capsys.readouterr().err


# -- processes ----------------------------------------------------------------------------------
def test_only_ranks_of_this_launch_are_killed(tmp_path):
    run_dir = str(tmp_path)
    ours = subprocess.Popen(["sleep", "60"], env={**os.environ, settings.RUN_DIR.name: run_dir})
    other = subprocess.Popen(["sleep", "60"])  # took a pid a rank once had
    try:
        (tmp_path / "pid-rank0").write_text(str(ours.pid))
        (tmp_path / "pid-rank1").write_text(str(other.pid))
        assert processes.kill_ranks(run_dir) == [0]
        assert ours.wait(timeout=10) == -signal.SIGKILL and other.poll() is None
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


# -- signals ------------------------------------------------------------------------------------
def test_a_signal_wakes_the_wait_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with StopSignals() as stop:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            assert stop.wait(proc, 20) is False
            assert stop.signum == signal.SIGTERM and time.monotonic() - started < 5
            assert stop.sleep(5) is False  # no relaunch after a signal
    finally:
        proc.kill()
        proc.wait()
    assert signal.getsignal(signal.SIGTERM) == before
    with StopSignals() as stop:
        assert stop.wait(subprocess.Popen(["true"]), 20) is True and stop.signum is None


def test_an_ignored_signal_stays_ignored():
    """`nohup ftcomm-run ...` ignores SIGHUP: so does ftcomm-run."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


# -- the ranks' side: FTCOMM_LAUNCHER, note_committed, the exit status ---------------------------
RANK = textwrap.dedent("""
    import os, sys, time
    import ftcomm
    from ftcomm.core import runtime
    runtime.note_committed(5)
    os.remove(os.path.join(os.environ["FTCOMM_RUN_DIR"], "committed-rank0"))
    runtime.note_committed(6)  # costs nothing: no second file
    print("ready", flush=True)
    time.sleep(float(sys.argv[1]))
    sys.exit(3)
""")


def start_rank(tmp_path, launcher: str | None, sleep_s: float) -> subprocess.Popen:
    """A one-process ftcomm program (a singleton MPI job) with FTCOMM_LAUNCHER=``launcher``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTCOMM_")}
    env[settings.RUN_DIR.name] = str(tmp_path)
    if launcher:
        env[settings.LAUNCHER.name] = launcher
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(sleep_s)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_rank_ends_when_its_launcher_is_gone(tmp_path):
    stand_in = subprocess.Popen(["sleep", "60"])  # plays ftcomm-run
    start = settings.process_start_time(stand_in.pid)
    rank = start_rank(tmp_path, f"{socket.gethostname()}:{stand_in.pid}:{start}", 60)
    try:
        stand_in.kill()
        stand_in.wait()
        assert rank.wait(timeout=10) == -signal.SIGKILL
    finally:
        rank.kill()
        stand_in.kill()


def test_a_rank_never_ends_on_a_guess(tmp_path):
    """FTCOMM_LAUNCHER's pid now names another process (another start time), or names a process
    on another host: no watch, so the end of that process ends no rank. The rank finishes, with
    its first committed step and its exit status reported."""
    for wrong in ("start time", "host"):
        stand_in = subprocess.Popen(["sleep", "60"])
        start = settings.process_start_time(stand_in.pid)
        launcher = (f"{socket.gethostname()}:{stand_in.pid}:{start + 1}" if wrong == "start time"
                    else f"elsewhere:{stand_in.pid}:{start}")
        rank = start_rank(tmp_path, launcher, 1.5)
        stand_in.kill()
        stand_in.wait()
        assert rank.wait(timeout=60) == 3, wrong
    assert not (tmp_path / "committed-rank0").exists()  # the second call wrote nothing
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["exit_status"] == 3 and not report["uncaught_exception"]


def test_launcher_identity_setting(monkeypatch):
    monkeypatch.setenv(settings.LAUNCHER.name, "node-7.example:1234:99")
    assert settings.launcher() == ("node-7.example", 1234, 99)
    monkeypatch.setenv(settings.LAUNCHER.name, "1234")
    with pytest.raises(ValueError, match=settings.LAUNCHER.name):
        settings.launcher()
    env = settings.launcher_environment("/tmp/run", 0, restart=2)
    assert env[settings.RESTART.name] == "2"
    host, pid, start = env[settings.LAUNCHER.name].rsplit(":", 2)
    assert int(pid) == os.getpid() and int(start) == settings.process_start_time(os.getpid())


# -- the relaunch loop, with a fake mpirun --------------------------------------------------------
FAKE_MPIRUN = textwrap.dedent("""\
    #!{python}
    # Plays mpirun: reads the -x NAME=VALUE and -n arguments, logs them, and ends the launch as
    # PLAN (one word per launch) says: "lost-n2" (a committed step, then n2's daemon session
    # dies, no rank finishes), "die" (a committed step, no rank finishes, status 1), "ok".
    import json, os, sys
    argv = sys.argv[1:]
    env = dict(argv[i + 1].split("=", 1) for i, w in enumerate(argv) if w == "-x" and "=" in argv[i + 1])
    run_dir, restart = env["FTCOMM_RUN_DIR"], int(env["FTCOMM_RESTART"])
    n = int(argv[argv.index("-n") + 1])
    hostfile = argv[argv.index("--hostfile") + 1] if "--hostfile" in argv else None
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({{"restart": restart, "n": n,
                              "hosts": open(hostfile).read() if hostfile else None}}) + "\\n")
    plan = os.environ["FAKE_PLAN"].split()[restart]
    open(os.path.join(run_dir, "committed-rank0"), "w").write("1")
    if plan == "lost-n2":
        agent = [argv[i + 2] for i, w in enumerate(argv) if w == "--mca" and argv[i + 1] == "plm_rsh_agent"][0]
        record_dir = agent.split()[1]
        open(os.path.join(record_dir, "session-1"), "w").write("host n2\\npid 1\\nstatus 255\\n")
        open(os.path.join(record_dir, "session-2"), "w").write("host n1\\npid 2\\nstatus 1\\n")
        sys.exit(0)
    if plan == "die":
        sys.exit(1)
    for rank in range(n):
        open(os.path.join(run_dir, f"rank{{rank}}.json"), "w").write(json.dumps(
            {{"world_rank": rank, "pid": 1, "lost": [], "uncaught_exception": False, "exit_status": 0}}))
""")


def fake_mpirun(tmp_path, monkeypatch, plan: str):
    fake = tmp_path / "mpirun"
    fake.write_text(FAKE_MPIRUN.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(command, "find_launcher", lambda mpi: str(fake))
    monkeypatch.setenv("FAKE_PLAN", plan)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log"))
    return lambda: [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]


def dry_run(capsys, *argv):
    assert run.main(["--dry-run", "--mpi", "openmpi", *argv]) == 0
    return shlex.split(capsys.readouterr().out)


def test_relaunch_without_the_lost_host_takes_the_spare(tmp_path, monkeypatch, capsys):
    launches = fake_mpirun(tmp_path, monkeypatch, "lost-n2 ok")
    (tmp_path / "hosts").write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    status = run.main(["--mpi", "openmpi", "--hostfile", str(tmp_path / "hosts"), "-n", "4", "--restarts", "2",
                       "--restart-backoff", "0.01", "prog"])
    err = capsys.readouterr().err
    assert status == 0, err
    first, second = launches()
    assert first == {"restart": 0, "n": 4, "hosts": "n1 slots=2\nn2 slots=2\nn3 slots=2\n"}  # the user's file
    assert second == {"restart": 1, "n": 4, "hosts": "n1 slots=2\nn3 slots=2\n"}
    assert ("job ended abnormally (launcher status 0 but no rank finished; lost host(s) n2); relaunch 1 of 2 "
            "in 0.0 s on hosts n1, n3 (4 ranks)") in err
    assert "exit status 0 after 1 relaunch(es)" in err


def test_relaunch_in_a_slurm_allocation_with_fewer_ranks(tmp_path, monkeypatch, capsys):
    launches = fake_mpirun(tmp_path, monkeypatch, "lost-n2 ok")
    fake_scontrol(tmp_path, monkeypatch, ["n1", "n2"])
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    status = run.main(["--mpi", "openmpi", "-n", "4", "--restarts", "1", "--restart-backoff", "0", "prog"])
    err = capsys.readouterr().err
    assert status == 0, err
    assert launches() == [{"restart": 0, "n": 4, "hosts": None}, {"restart": 1, "n": 2, "hosts": "n1 slots=2\n"}]
    assert "hold 2 ranks, not 4 ranks" in err and "on hosts n1 (2 ranks)" in err


def test_relaunches_run_out(tmp_path, monkeypatch, capsys):
    launches = fake_mpirun(tmp_path, monkeypatch, "die die die")
    status = run.main(["--mpi", "openmpi", "-n", "3", "--restarts", "2", "--restart-backoff", "0.01", "prog"])
    err = capsys.readouterr().err
    assert status == 1, err  # the last launch's status
    assert [launch["restart"] for launch in launches()] == [0, 1, 2]
    assert "relaunch 1 of 2 in 0.0 s on the same hosts (3 ranks)" in err and "relaunch 2 of 2 in 0.0 s" in err
    assert "exit status 1 after 2 relaunch(es)" in err


def test_no_restarts_is_one_launch(tmp_path, monkeypatch, capsys):
    launches = fake_mpirun(tmp_path, monkeypatch, "die")
    assert run.main(["--mpi", "openmpi", "-n", "3", "prog"]) == 1
    assert len(launches()) == 1 and "relaunch" not in capsys.readouterr().err


def test_restart_arguments_are_checked(capsys):
    for argv in (["--restarts", "-1"], ["--restart-backoff", "-1"], ["--recovered", "1"]):  # no abbreviations
        with pytest.raises(SystemExit) as exc:
            run.main(["--dry-run", "--mpi", "openmpi", "-n", "2", *argv, "prog"])
        assert exc.value.code == 2
    capsys.readouterr()


def test_help_lists_examples_exit_statuses_and_settings(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "--restarts 2" in text
    for status in ("70", "124", "128+N"):
        assert f"\n  {status} " in text
    assert 'README, "Tuning"' in text
