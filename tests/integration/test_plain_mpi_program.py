"""ftcomm-run runs any MPI program, not only ftcomm's: a plain mpi4py script that never imports
ftcomm ends with the launcher's own status, and no rank is called lost."""
from harness import run_job

PLAIN = """\
import sys
from mpi4py import MPI
world = MPI.COMM_WORLD
total = world.allreduce(world.rank + 1)
print(f"rank {world.rank} of {world.size}: sum {total}", flush=True)
sys.exit(int(sys.argv[1]) if world.rank == world.size - 1 else 0)
"""


def test_a_program_without_ftcomm_succeeds_as_under_mpirun(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    job = run_job(script, 3, 0, timeout=90)
    assert job.returncode == 0, job.describe()
    assert sorted(line for line in job.stdout.splitlines() if line.startswith("rank ")) == [
        f"rank {r} of 3: sum 6" for r in range(3)]
    assert "lost" not in job.stderr and "failed" not in job.stderr, job.stderr


def test_its_failure_keeps_the_programs_exit_status(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    job = run_job(script, 2, 3, timeout=90)
    assert job.returncode == 3, job.describe()
