import os

import pytest

from ftcomm.launch import command, reports, run


def dry_run(capsys, *argv):
    assert run.main(["--dry-run", *argv]) == 0
    return capsys.readouterr().out.split()


def test_dry_run_switches_ulfm_on_with_fault_tolerant_transports(capsys):
    cmd = dry_run(capsys, "-n", "4", "python", "train.py", "--lr", "0.1")
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
    cmd = dry_run(capsys, "-n", "8", "--hostfile", "hosts", "--mca", "btl", "self,tcp", "--no-ft", "./a.out")
    assert cmd[cmd.index("--hostfile") + 1] == "hosts"
    assert "--with-ft" not in cmd
    btl = [cmd[i + 2] for i, w in enumerate(cmd) if w == "--mca" and cmd[i + 1] == "btl"]
    assert btl == ["self,tcp"]
    assert cmd[-1] == "./a.out"


def test_mpich_uses_hydra_without_auto_cleanup(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(command, "find_launcher", lambda mpi: str(fake))
    cmd = dry_run(capsys, "-n", "2", "--mpi", "mpich", "prog")
    assert "-disable-auto-cleanup" in cmd
    assert cmd[cmd.index("-genv") + 1:cmd.index("-genv") + 3] == ["MPIR_CVAR_ENABLE_FT", "1"]


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
    cmd = dry_run(capsys, "-n", "4", "--spares", "2", "python", "train.py")
    assert cmd[cmd.index("-n") + 1] == "6"
    exported = [cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"]
    assert "FTCOMM_SPARES=2" in exported and "FTCOMM_SPARES" not in exported


def test_negative_spares_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--dry-run", "-n", "4", "--spares", "-1", "python", "x.py"])
    assert exc.value.code == 2 and "--spares must be at least 0" in capsys.readouterr().err
