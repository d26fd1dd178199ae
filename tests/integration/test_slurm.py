"""ftcomm under a real Slurm: a one-node cluster (munged, slurmctld, slurmd of Debian's `slurm-wlm`)
started on this machine for the module (tests/slurm_cluster.py), and jobs submitted with sbatch.

- mpi_configs/slurm.sbatch runs the README's demo (examples/train_digits.py --kill 2@40) at 4
  ranks: the job completes with exit code 0, the survivors finish at world size 3 after one
  failure with a sane accuracy, and ftcomm-run says the job recovered.
- scancel of a long training job submitted through slurm.sbatch ends every process of it (the
  batch shell, ftcomm-run, prterun, the 4 ranks) within LEFTOVER_S, before Slurm's own SIGKILL
  (KillWait, 30 s), and ftcomm-run says SIGTERM ended the job.
- ftcomm-run inside an allocation without --hostfile runs on Slurm's hosts: mpirun's allocation
  is the Slurm node with the job's task count as its slots (not this machine's core count), and a
  `--restarts` relaunch runs on the hosts `scontrol show hostnames` gives (``hosts.slurm_hosts``),
  shrunk to the ranks the allocation holds.

Skips, saying why, where the Slurm daemons are not installed or the node never becomes idle,
where pytest does not run in a virtual environment (slurm.sbatch activates one: FTCOMM_VENV) and
where ftcomm's MPI is not Open MPI. Every process of a job carries a marker in its environment;
whatever is left of a job, and the daemons, are killed even when a test fails.
"""
import json
import os
import re
import shlex
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness import JOBS, REPO, job_environment, parse_reports
from slurm_cluster import SlurmCluster, Unavailable, marked_processes

SBATCH = REPO / "mpi_configs" / "slurm.sbatch"
VENV = Path(sys.prefix)
# After scancel, how long the job's processes may take to end (Slurm SIGKILLs them after KillWait,
# 30 s: this bound is below it, so what ends them in time is the SIGTERM that scancel sends).
LEFTOVER_S = 20.0
JOB_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def slurm():
    cluster = SlurmCluster()
    try:
        try:
            cluster.start(timeout=60)
        except Unavailable as exc:
            why = str(exc)
            print(why, file=sys.stderr)  # the daemons' logs, for a reader of the skip
            pytest.skip(f"no Slurm cluster here: {why.splitlines()[0]}")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def openmpi():
    from ftcomm.launch.command import detect_mpi

    try:
        mpi = detect_mpi()
    except FileNotFoundError as exc:
        pytest.skip(f"no MPI launcher: {exc}")
    if mpi != "openmpi":
        pytest.skip(f"needs Open MPI (recovery, mpirun's Slurm support); ftcomm's MPI here is {mpi}")


@pytest.fixture(scope="module")
def venv(openmpi):
    if sys.prefix == sys.base_prefix or not (VENV / "bin" / "activate").is_file():
        pytest.skip(f"slurm.sbatch activates a virtual environment (FTCOMM_VENV); pytest runs in none ({sys.prefix})")
    return VENV


def _ps(marker: str) -> dict[int, list[str]]:
    """The running processes whose environment carries JOB_MARKER=``marker``: pid -> arguments."""
    found = {}
    for pid in marked_processes(marker, "JOB_MARKER"):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            pass
    return found


def _kill_left(marker: str) -> dict[int, str]:
    """Kills whatever of the job still runs; returns what that was."""
    left = _ps(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _describe(cluster: SlurmCluster, job_id: int, out: Path) -> str:
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    return f"job {job_id}: {cluster.job(job_id)}\n--- output ---\n{text[-6000:]}\n{cluster.logs()}"


def _submit(cluster, marker: str, tmp_path: Path, *args: str, extra_env=None) -> tuple[int, Path]:
    out = tmp_path / "job.out"
    env = {"JOB_MARKER": marker, **(extra_env or {})}
    job_id = cluster.submit("-N1", "-o", str(out), *args, env=env, base=job_environment(), cwd=str(REPO))
    return job_id, out


@pytest.mark.timeout(300)
def test_the_sbatch_example_trains_through_a_kill_and_recovers(venv, slurm, tmp_path):
    marker = f"slurm-train-{uuid.uuid4().hex[:8]}"
    job_id, out = _submit(slurm, marker, tmp_path, "-n4", "--ntasks-per-node=4", str(SBATCH),
                          "examples/train_digits.py", "--kill", "2@40", "--epochs", "20", "--no-progress",
                          "--log-dir", str(tmp_path / "logs"), extra_env={"FTCOMM_VENV": venv})
    try:
        job = slurm.wait_job(job_id, JOB_TIMEOUT_S)
        text = out.read_text()
        assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), _describe(slurm, job_id, out)
        summaries = [json.loads(line[len("SUMMARY "):]) for line in text.splitlines() if line.startswith("SUMMARY ")]
        assert len(summaries) == 1, _describe(slurm, job_id, out)
        summary = summaries[0]
        assert summary["world_size"] == 3 and summary["failures"] == 1, summary
        # 20 epochs of 22 global batches (1347 samples, 64 a batch), the interrupted step redone once
        assert summary["steps"] == 440 and summary["redone_steps"] == 1, summary
        assert [(m["killed_rank"], m["step"]) for m in summary["mttr"]] == [(2, 40)], summary
        assert 0.9 <= summary["accuracy"] <= 1.0, summary
        assert "ftcomm-run: job recovered: 3 of 4 processes finished, lost world rank(s) [2]" in text, text[-3000:]
    finally:
        left = _kill_left(marker)
    assert not left, f"left running after the job ended: {left}"


@pytest.mark.timeout(300)
def test_scancel_ends_every_process_of_the_job(venv, slurm, tmp_path):
    marker = f"slurm-cancel-{uuid.uuid4().hex[:8]}"
    logs = tmp_path / "logs"
    job_id, out = _submit(slurm, marker, tmp_path, "-n4", "--ntasks-per-node=4", str(SBATCH),
                          "examples/train_digits.py", "--epochs", "100000", "--no-progress", "--log-dir", str(logs),
                          extra_env={"FTCOMM_VENV": venv})
    try:
        # Running: each of the 4 ranks has committed a training step (its log says so).
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            files = list(logs.glob("*.rank*.jsonl"))
            if len(files) == 4 and all('"commit"' in f.read_text() for f in files):
                break
            job = slurm.job(job_id)
            assert job.get("JobState") in ("PENDING", "RUNNING"), _describe(slurm, job_id, out)
            time.sleep(0.5)
        else:
            pytest.fail(f"the ranks did not commit a step in {JOB_TIMEOUT_S:g} s\n{_describe(slurm, job_id, out)}")
        before = _ps(marker)
        programs = [Path(argv[1] if Path(argv[0]).name.startswith("python") else argv[0]).name
                    for argv in before.values() if argv]
        assert programs.count("train_digits.py") == 4, before  # the ranks
        assert programs.count("ftcomm-run") == 1, before
        assert {"prterun", "mpirun"} & set(programs), before

        cancel = slurm.run("scancel", str(job_id))
        assert cancel.returncode == 0, cancel.stderr
        sent = time.monotonic()
        while _ps(marker) and time.monotonic() - sent < LEFTOVER_S:
            time.sleep(0.2)
        took = time.monotonic() - sent
        left = _ps(marker)
        assert not left, f"{took:.1f} s after scancel, still running: {left}"
        job = slurm.wait_job(job_id, 60)
        assert job["JobState"] == "CANCELLED", _describe(slurm, job_id, out)
        assert "ftcomm-run: SIGTERM: ended the job" in out.read_text(), _describe(slurm, job_id, out)
    finally:
        slurm.run("scancel", str(job_id))
        _kill_left(marker)


@pytest.mark.timeout(300)
def test_ftcomm_run_in_an_allocation_takes_its_hosts_from_slurm(openmpi, slurm, tmp_path):
    marker = f"slurm-hosts-{uuid.uuid4().hex[:8]}"
    # The allocation's task count, told apart from the core count mpirun would give this host
    # outside Slurm; ftcomm-run asks for one rank more than it holds.
    tasks = 3 if os.cpu_count() != 3 else 5
    ranks = tasks + 1
    command = [sys.executable, "-m", "ftcomm.launch", "--restarts", "1", "--restart-backoff", "0.2",
               "--timeout", "150", "--mpirun-args=--display-allocation", "-n", str(ranks),
               sys.executable, str(JOBS / "slurm_relaunch.py"), marker]
    pythonpath = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    job_id, out = _submit(slurm, marker, tmp_path, f"-n{tasks}", "--wrap", shlex.join(command),
                          extra_env={"PYTHONPATH": pythonpath})
    try:
        job = slurm.wait_job(job_id, JOB_TIMEOUT_S)
        text = out.read_text()
        why = _describe(slurm, job_id, out)
        assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), why
        node = slurm.node
        # mpirun's allocation (both launches): the Slurm node, with the job's tasks as its slots
        allocated = re.findall(r"^\s+(\S+): slots=(\d+) ", text, re.MULTILINE)
        launches = set(re.findall(r"ALLOCATED NODES FOR JOB (\S+)@", text))
        assert len(launches) == 2 and set(allocated) == {(node, str(tasks))}, why
        # launch 0: the ranks run on the Slurm node, in an allocation of `tasks` tasks
        reports = parse_reports(text)
        first = [r for r in reports if r["event"] == "start" and r["restart"] == 0]
        assert sorted(r["world_rank"] for r in first) == list(range(ranks)), why
        assert {(r["size"], r["host"].split(".")[0], r["slurm_ntasks"], r["slurm_nodelist"]) for r in first} == \
            {(ranks, node, str(tasks), node)}, why
        # the relaunch: on Slurm's hosts (slurm_hosts), as many ranks as the allocation holds
        assert f"the usable hosts hold {tasks} ranks, not {ranks} ranks: the relaunch runs with fewer" in text, why
        assert f"relaunch 1 of 1 in 0.2 s on hosts {node} ({tasks} ranks)" in text, why
        again = [r for r in reports if r["event"] == "start" and r["restart"] == 1]
        assert sorted(r["world_rank"] for r in again) == list(range(tasks)), why
        assert {(r["size"], r["host"].split(".")[0]) for r in again} == {(tasks, node)}, why
        done = [r for r in reports if r["event"] == "done"]
        assert sorted(r["world_rank"] for r in done) == list(range(tasks)), why
        assert "ftcomm-run: exit status 0 after 1 relaunch(es)" in text, why
    finally:
        left = _kill_left(marker)
    assert not left, f"left running after the job ended: {left}"
