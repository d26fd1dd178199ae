import os
import subprocess
import time

import pytest

from ftcomm.launch import command, reports, run, watch


def dry_run(capsys, *argv):
    assert run.main(["--dry-run", *argv]) == 0
    return capsys.readouterr().out.split()


def test_dry_run_switches_ulfm_on_with_fault_tolerant_transports(capsys):
    cmd = dry_run(capsys, "--mpi", "openmpi", "-n", "4", "python", "train.py", "--lr", "0.1")
    assert cmd[0].endswith("mpirun")
    assert cmd[cmd.index("--with-ft") + 1] == "ulfm"
    assert cmd[cmd.index("-n") + 1] == "4"
    mca = {cmd[i + 1]: cmd[i + 2] for i, w in enumerate(cmd) if w == "--mca"}
    assert mca["pml"] == "ob1"
    assert mca["btl"] == "self,sm,tcp"
    assert "han" in mca["coll"]
    assert "--oversubscribe" in cmd
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    assert cmd[-3:] == ["train.py", "--lr", "0.1"]  # python became this interpreter
    assert cmd[-4].endswith("python") or "python" in cmd[-4]


def test_hostfile_mca_override_and_no_ft(capsys):
    cmd = dry_run(capsys, "--mpi", "openmpi", "-n", "8", "--hostfile", "hosts", "--mca", "btl", "self,tcp", "--no-ft",
                  "./a.out")
    assert cmd[cmd.index("--hostfile") + 1] == "hosts"
    assert "--with-ft" not in cmd
    btl = [cmd[i + 2] for i, w in enumerate(cmd) if w == "--mca" and cmd[i + 1] == "btl"]
    assert btl == ["self,tcp"]
    assert cmd[-1] == "./a.out"


def fake_launcher(tmp_path, monkeypatch, version_text):
    """An `mpiexec` that prints ``version_text`` for --version, used as the launcher."""
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{version_text}\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setattr(command, "find_launcher", lambda mpi: str(fake))
    return fake


HYDRA_VERSION = "HYDRA build details:\n    Version:                                 5.0.2"


def test_mpich_runs_hydra_failure_free_with_auto_cleanup(capsys, tmp_path, monkeypatch):
    fake = fake_launcher(tmp_path, monkeypatch, HYDRA_VERSION)
    cmd = dry_run(capsys, "-n", "2", "--ranks-per-node", "2", "prog")  # found by --version: MPICH
    assert cmd[0] == str(fake) and cmd[cmd.index("-n") + 1] == "2" and cmd[-1] == "prog"
    assert cmd[cmd.index("-ppn") + 1] == "2"
    # No fault tolerance on MPICH's ch4 device: no MPIR_CVAR_ENABLE_FT (MPI_Init would assert), and
    # hydra's auto-cleanup stays on, so that a dead rank ends the job instead of leaving it waiting.
    assert "-disable-auto-cleanup" not in cmd and "MPIR_CVAR_ENABLE_FT" not in cmd
    genv = {cmd[i + 1]: cmd[i + 2] for i, w in enumerate(cmd) if w == "-genv"}
    assert "FTCOMM_RUN_DIR" in genv and "FTCOMM_SPARES" not in genv


def test_mpich_with_ft_switched_on_in_its_file(capsys, tmp_path, monkeypatch):
    fake_launcher(tmp_path, monkeypatch, HYDRA_VERSION)
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "mpich.env").write_text("MPIR_CVAR_ENABLE_FT = 1  # a ch3 build\n")
    monkeypatch.setattr(command, "config_dir", lambda: configs)
    cmd = dry_run(capsys, "--mpi", "mpich", "-n", "2", "--spares", "1", "prog")
    assert "-disable-auto-cleanup" in cmd and cmd[cmd.index("-n") + 1] == "3"
    genv = {cmd[i + 1]: cmd[i + 2] for i, w in enumerate(cmd) if w == "-genv"}
    assert genv["MPIR_CVAR_ENABLE_FT"] == "1" and genv["FTCOMM_SPARES"] == "1"
    cmd = dry_run(capsys, "--mpi", "mpich", "--no-ft", "-n", "2", "prog")
    assert "-disable-auto-cleanup" not in cmd and "MPIR_CVAR_ENABLE_FT" not in cmd


@pytest.mark.parametrize("argv, message", [
    (["--spares", "1"], "--spares needs recovery, which is off on MPICH"),
    (["--mca", "btl", "self"], "--mca is for Open MPI"),
])
def test_mpich_refuses_what_needs_open_mpi(capsys, tmp_path, monkeypatch, argv, message):
    fake_launcher(tmp_path, monkeypatch, HYDRA_VERSION)
    with pytest.raises(SystemExit) as exc:
        run.main(["--dry-run", "--mpi", "mpich", "-n", "2", *argv, "prog"])
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("version_text, family", [
    ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/", "openmpi"),
    (HYDRA_VERSION, "mpich"),
])
def test_auto_detects_the_family_from_mpiexec(tmp_path, monkeypatch, version_text, family):
    fake_launcher(tmp_path, monkeypatch, version_text)
    assert command.detect_mpi() == family


def test_auto_detection_refuses_an_unknown_launcher(capsys, tmp_path, monkeypatch):
    fake_launcher(tmp_path, monkeypatch, "some other launcher 1.0")
    with pytest.raises(SystemExit) as exc:
        run.main(["--dry-run", "-n", "2", "prog"])
    assert exc.value.code == 2 and "neither Open MPI's nor MPICH's: pass --mpi" in capsys.readouterr().err


def test_default_launcher_is_the_one_ftcomm_was_built_with(capsys):
    import ftcomm

    cmd = dry_run(capsys, "-n", "2", "prog")
    family = ftcomm.mpi_family()
    assert family in ("Open MPI", "MPICH")
    if family == "Open MPI":
        assert cmd[0].endswith("mpirun") and "--with-ft" in cmd
    else:
        assert "HYDRA" in subprocess.run([cmd[0], "--version"], capture_output=True, text=True).stdout


HYDRA_REPORT = ("step 40\n\n" + "=" * 83 + "\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
                "=   PID 5784 RUNNING AT node7\n=   EXIT CODE: 9\n=   CLEANING UP REMAINING PROCESSES\n"
                + "=" * 83 + "\nYOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n")


def test_mpich_failure_names_the_rank_that_ended_first():
    assert reports.hydra_report(HYDRA_REPORT) == (5784, "Killed (signal 9)")
    assert reports.hydra_report("all went well\n") is None
    # mpiexec's report names the same process: its words say how it ended.
    assert reports.mpich_failure((2, 5784), HYDRA_REPORT) == "world rank 2 (pid 5784) ended first: Killed (signal 9)"
    # It names a process it killed itself afterwards: only which rank ended first is said.
    assert reports.mpich_failure((1, 5790), HYDRA_REPORT) == "world rank 1 (pid 5790) ended first"
    assert reports.mpich_failure(None, HYDRA_REPORT) == "a process of the job ended (mpiexec's report: pid 5784: Killed (signal 9))"


def test_the_watch_sees_which_rank_ended_first(tmp_path):
    """Three processes stand in for ranks (pid files in the run directory, as ranks publish them);
    the middle one is killed, and later the others: the watch names the middle one."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        for rank, proc in enumerate(procs):
            (tmp_path / f"pid-rank{rank}").write_text(str(proc.pid))
        first = watch.FirstToEnd(str(tmp_path), 3)
        first.start()
        time.sleep(0.3)  # the watch has opened every pidfd
        procs[1].kill()
        procs[1].wait()
        time.sleep(0.3)
        for proc in procs:
            proc.kill()
        assert first.result() == (1, procs[1].pid)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_bad_arguments_exit_with_usage():
    with pytest.raises(SystemExit):
        run.main(["-n", "0", "prog"])
    with pytest.raises(SystemExit):
        run.main(["-n", "2"])


def test_mca_file_parser_rejects_garbage(tmp_path):
    f = tmp_path / "x.conf"
    f.write_text("# comment\npml = ob1\nnot a setting\n")
    with pytest.raises(ValueError, match="x.conf:3"):
        command.read_settings_file(f)


def test_summary_counts_lost_ranks(tmp_path):
    (tmp_path / "rank0.json").write_text('{"world_rank": 0, "pid": 1, "lost": [2]}')
    (tmp_path / "rank1.json").write_text('{"world_rank": 1, "pid": 2, "lost": [2]}')
    assert reports.summarize(str(tmp_path), 4) == ([0, 1], [2, 3])


def test_spares_add_processes_and_tell_the_ranks(capsys, monkeypatch):
    monkeypatch.setenv("FTCOMM_SPARES", "9")  # a stale value in the caller's environment is not forwarded
    cmd = dry_run(capsys, "--mpi", "openmpi", "-n", "4", "--spares", "2", "python", "train.py")
    assert cmd[cmd.index("-n") + 1] == "6"
    exported = [cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"]
    assert "FTCOMM_SPARES=2" in exported and "FTCOMM_SPARES" not in exported


def test_negative_spares_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--dry-run", "-n", "4", "--spares", "-1", "python", "x.py"])
    assert exc.value.code == 2 and "--spares must be at least 0" in capsys.readouterr().err
