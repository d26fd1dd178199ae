"""An MPI job that cannot recover (MPICH, whose ch4 device has no ULFM; Open MPI launched with
--no-ft): the failure-free API works, each recovery verb raises UlfmUnavailableError at once on
every rank, saying why (ftcomm.ulfm_status()), and a rank that fails ends the whole job within
seconds instead of leaving the others waiting. The MPICH-only tests run in CI's MPICH leg
(.ci/mpich), where ftcomm is built against the `mpich` wheel."""
import re
import time

import pytest

import ftcomm
from harness import JOBS, run_job

FAMILY = ftcomm.mpi_family()
# Open MPI can recover: to see it without ULFM, launch it so.
NO_FT = ("--no-ft",) if FAMILY == "Open MPI" else ()
mpich_only = pytest.mark.skipif(FAMILY != "MPICH", reason="ftcomm is built against Open MPI here; CI's MPICH leg "
                                                         "(.ci/mpich) runs this")
VERBS = ("revoke", "shrink", "failed_ranks", "recover", "recover_spares", "shrink_to_survivors")


def test_recovery_verbs_raise_at_once_on_every_rank_and_the_communicator_stays_whole():
    n = 3
    job = run_job(JOBS / "no_ulfm.py", n, timeout=90, launcher_args=NO_FT)
    assert job.returncode == 0, job.describe()
    reports = {r["world_rank"]: r for r in job.reports if "verbs" in r}
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["ft_enabled"] is False and rep["family"] == FAMILY
        status = rep["ulfm_status"]
        if FAMILY == "MPICH":
            assert re.match(r"MPICH 5\.0\.\d+ \(device ch4:.*\) has no fault tolerance", status), status
        else:
            assert status.startswith("Open MPI v5.0") and "runs without ULFM" in status, status
        assert sorted(rep["verbs"]) == sorted(VERBS)
        for verb, (raised, seconds, message) in rep["verbs"].items():
            assert raised == "UlfmUnavailableError", (verb, raised, message)
            assert seconds < 0.5, (verb, seconds)  # at once: no communication, no deadline waited out
            assert status in message, message
        assert rep["is_revoked"] is False
        assert rep["sum"] == [n * (n + 1) // 2] * 3  # the communicator still works
    assert len(job.by_rank(event="done")) == n


def test_an_uncaught_exception_on_one_rank_ends_the_job_at_once():
    job = run_job(JOBS / "no_ulfm.py", 3, "--raise-at", "5", timeout=90, launcher_args=NO_FT)
    assert job.returncode != 0, job.describe()
    assert job.by_rank(event="done") == {}, job.describe()
    assert "ftcomm: world rank 1 ended by an uncaught exception; ending the job" in job.stderr, job.describe()
    if FAMILY == "MPICH":
        assert "ftcomm-run: world rank(s) [1] ended by an uncaught exception; MPICH cannot recover" in job.stderr
    # Ended by MPI_Abort, not by a deadline (60 s for each allreduce) or the finalize timeout (30 s).
    assert job.wall_s < 20, job.wall_s


@mpich_only
def test_a_killed_rank_ends_the_job_within_seconds_and_is_named():
    job = run_job(JOBS / "elastic_train.py", 4, env={"FTCOMM_FAULT": "rank=2,point=train_step,step=6"},
                  timeout=120)
    end = time.time()
    assert job.returncode == 9, job.describe()  # mpiexec's status: a rank killed by signal 9
    killed_at = float(re.search(r"fault injection: kill rank 2 at train_step \(step 6\), unix time ([\d.]+)",
                                job.stderr).group(1))
    assert end - killed_at < 5, end - killed_at
    assert ("ftcomm-run: world rank 2 (pid " in job.stderr and ") ended first" in job.stderr
            and "MPICH cannot recover from a rank failure (no ULFM), so the whole job was ended" in job.stderr), \
        job.describe()
    assert "ftcomm-run: MPICH: recovery is off" in job.stderr
    assert job.by_rank(event="done") == {}
    steps = {r["step"] for r in job.reports if r.get("event") == "used"}
    assert max(steps) == 5, sorted(steps)  # every step before the kill committed, none after


@mpich_only
def test_elastic_driver_without_failures():
    job = run_job(JOBS / "elastic_train.py", 4, timeout=120)
    assert job.returncode == 0, job.describe()
    done = job.by_rank(event="done")
    assert sorted(done) == [0, 1, 2, 3], job.describe()
    assert all(d["steps"] == 20 and d["failures"] == 0 and d["redone"] == 0 and d["size"] == 4 for d in done.values())
    epochs = {}
    for r in job.reports:
        if r.get("event") == "used":
            epochs.setdefault(r["epoch"], []).extend(r["indices"])
    assert sorted(epochs) == [0, 1]
    for epoch, used in epochs.items():
        assert sorted(used) == list(range(300)), f"epoch {epoch}: a sample skipped or used twice"


@mpich_only
@pytest.mark.timeout(150)
def test_torch_backend_collectives_and_ddp_match_gloo():
    pytest.importorskip("torch")
    n = 3
    job = run_job(JOBS / "torch_collectives.py", n, timeout=110)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank(kind="result")
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["backend"] == "ftcomm" and rep["checks"] >= 30 and rep["errors"] == {}, rep
        assert rep["grad_err"] <= 1e-6 and rep["param_err"] <= 1e-6, rep
