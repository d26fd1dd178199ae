"""The examples parse their command line before torch and MPI load, refuse abbreviations, and
print a usage error once per job (world rank 0), every rank exiting with status 2 (examples/cli.py).

"Before the heavy imports" is checked by putting first on the path packages named torch, mpi4py,
sklearn and ftcomm that raise when imported: a script that imported any of them before parsing
would fail with that error instead of argparse's."""
import subprocess
import sys

import pytest

from harness import REPO, job_environment

EXAMPLES = ["train_digits.py", "ddp_train.py", "zero_train.py", "shrink_demo.py", "pipeline_train.py", "moe_all_to_all.py"]
POISONED = ("torch", "mpi4py", "sklearn", "ftcomm", "numpy")


@pytest.fixture(scope="module")
def poisoned_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("poisoned")
    for name in POISONED:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} imported before the arguments were parsed')\n")
    return root


def _example(name, *args, poisoned, rank=None):
    env = job_environment()
    env["PYTHONPATH"] = str(poisoned)
    for variable in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        env.pop(variable, None)
    if rank is not None:
        env["OMPI_COMM_WORLD_RANK"] = str(rank)
    return subprocess.run([sys.executable, str(REPO / "examples" / name), *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_abbreviation_is_an_error_said_once_before_any_heavy_import(name, poisoned_path):
    res = _example(name, "--kil", "2@30", poisoned=poisoned_path)
    assert res.returncode == 2, res.stderr
    assert "imported before" not in res.stderr
    assert res.stderr.count("unrecognized arguments: --kil 2@30") == 1 and res.stderr.count("usage:") == 1
    assert res.stdout == ""


@pytest.mark.parametrize("name", EXAMPLES)
def test_other_ranks_exit_with_the_same_status_silently(name, poisoned_path):
    res = _example(name, "--kil", "2@30", poisoned=poisoned_path, rank=3)
    assert (res.returncode, res.stdout, res.stderr) == (2, "", "")
    helped = _example(name, "--help", poisoned=poisoned_path, rank=1)
    assert (helped.returncode, helped.stdout) == (0, "")


def test_a_malformed_kill_is_refused_once(poisoned_path):
    res = _example("train_digits.py", "--kill", "2-30", poisoned=poisoned_path, rank=0)
    assert res.returncode == 2 and res.stderr.count("--kill takes RANK@STEP") == 1, res.stderr
    res = _example("ddp_train.py", "--kill", "2-30", poisoned=poisoned_path, rank=0)
    assert res.returncode == 2 and res.stderr.count("expected RANK@STEP") == 1, res.stderr


@pytest.mark.parametrize("script", ["ddp_train.py", "zero_train.py"])
def test_training_on_cuda_without_a_device_says_so_once(tmp_path, script):
    """--device cuda where torch sees no CUDA device: one message, every rank exits with status 2."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    res = subprocess.run([sys.executable, "-m", "ftcomm.launch", "-n", "2", "--timeout", "120", sys.executable,
                          str(REPO / "examples" / script), "--device", "cuda", "--log-dir", str(tmp_path)],
                         capture_output=True, text=True, env=job_environment(), timeout=180, cwd=REPO,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count(f"{script}: --device cuda needs a CUDA device, and torch") == 1, res.stderr
    assert "Traceback" not in res.stderr
