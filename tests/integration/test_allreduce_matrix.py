"""The allreduce's correctness matrix: at 2, 3 and 4 ranks, every dtype x op and the odd lengths
(0, 1, N-1, N+1, a prime, 64 MiB + 3 elements): exact against numpy for integer-valued inputs
(within the dtype's tolerance for avg and non-integer floats), bitwise identical on every rank."""
import pytest

from harness import JOBS, run_job


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_dtype_op_and_length(n):
    args = ["--big"] if n == 2 else []  # the 64 MiB cases once, where ranks do not outnumber cores
    job = run_job(JOBS / "allreduce_matrix.py", n, *args, timeout=1200)
    assert job.returncode == 0, job.describe()
    reports = job.by_rank()
    assert sorted(reports) == list(range(n)), job.describe()
    for rep in reports.values():
        assert rep["failures"] == [], rep["failures"]
    digests = [rep["digests"] for rep in reports.values()]
    assert all(d == digests[0] for d in digests), "results differ between ranks"
    lengths = {0, 1, n - 1, n + 1, 10007} | ({"64MiB+3"} if args else set())
    assert len(digests[0]) == 6 * 5 * len(lengths) + 4  # every case ran, plus 4 non-integer sums
