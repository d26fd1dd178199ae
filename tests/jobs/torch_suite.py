"""Job: tests of torch's own backend suite (torch/testing/_internal/distributed/distributed_test.py,
``DistributedTest._DistTestBase``) run on every rank of one ftcomm-run job, one after another, on
a process group of the backend ``--backend`` (ftcomm or gloo).

torch's suite chooses its tests and their code paths by the name in $BACKEND (decorators such as
"only gloo supports timeouts" when it is imported, branches such as ``if BACKEND == "gloo"`` in the
tests). It is read as gloo throughout, so that both backends run gloo's selection and gloo's CPU
paths, except in the few tests that create a group by that name or check the group's name
(``BY_NAME``), which get the backend under test.

Per test, as torch's own runner (TestDistBackend._run) does: a fresh file store, the group
initialised, torch's file barrier, the test, the barrier, the group destroyed. Between tests the
ranks meet on MPI_COMM_WORLD and torch's file barrier is reset, so that one test that failed on
some rank does not skew the next. A test still running after --deadline seconds is reported as a
hang and the whole job is aborted (the caller starts the remaining tests in a new job).

Three tests of our own (``CpuAdapted``) run torch's CUDA-only tests of reduce_scatter_tensor and
all_gather_into_tensor on CPU tensors.

Usage: torch_suite.py --backend ftcomm --temp-dir DIR TEST [TEST...]
       torch_suite.py --backend gloo --temp-dir DIR --list     (one rank: reports "tests", every name)
Reports: one "result" per test and rank (test, outcome: pass / fail / error / skip, seconds,
message), then "hang" (test) if one hung.
"""
import argparse
import os
import sys
import threading
import time
import traceback
import unittest
from datetime import timedelta

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--backend", required=True, choices=("ftcomm", "gloo"))
parser.add_argument("--temp-dir", required=True, help="a directory every rank sees (torch's TEMP_DIR)")
parser.add_argument("--deadline", type=float, default=120.0, help="seconds a test may take before it counts as hung")
parser.add_argument("--list", action="store_true", help="report the suite's test names and end")
parser.add_argument("tests", nargs="*")
args = parser.parse_args()

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
os.environ.update(BACKEND="gloo", WORLD_SIZE=str(SIZE), TEMP_DIR=args.temp_dir)
for sub in ("barrier", "test_dir", "init_dir"):
    os.makedirs(os.path.join(args.temp_dir, sub), exist_ok=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_utils  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402

import ftcomm.torch  # noqa: E402,F401  (registers "ftcomm")
from harness import report  # noqa: E402

# the tests that create a group by the name in BACKEND, or check a group's backend name against it
BY_NAME = {"test_get_backend", "test_Backend_enum_class", "test_barrier_timeout_global", "test_ddp_has_finalized"}
SKIP_EXIT_CODES = {skip.exit_code for skip in TEST_SKIPS.values()}


class CpuAdapted:
    """torch's tests of reduce_scatter_tensor and all_gather_into_tensor are CUDA-only
    (``test_reduce_scatter_tensor_cuda``, ``test_all_gather_into_{cat,stack}_tensor_cuda``): the
    same inputs and checks on CPU tensors, through torch's own helpers with ``cuda=False``."""

    def test_reduce_scatter_tensor_cpu(self):
        group, group_id, rank = self._init_global_test()
        size = 2
        expected = torch.arange(rank * size, (rank + 1) * size) * len(group)
        for tensor_in in (torch.arange(len(group) * size), torch.arange(len(group) * size).reshape(len(group), size)):
            out = self._reduce_scatter_tensor_helper(torch.zeros(size, dtype=torch.int64), tensor_in, group_id, rank,
                                                     cuda=False)
            self.assertEqual(out, expected)
            self._barrier()

    def test_all_gather_into_cat_tensor_cpu(self):
        self._all_gather_into_tensor_cpu(torch.cat)

    def test_all_gather_into_stack_tensor_cpu(self):
        self._all_gather_into_tensor_cpu(torch.stack)

    def _all_gather_into_tensor_cpu(self, join):
        group, group_id, rank = self._init_global_test()
        size = 2
        blocks = [torch.ones([size, size]) * i for i in group]
        out = torch.full(join(blocks).shape, -1.0)
        out = self._all_gather_into_tensor_helper(out, torch.ones([size, size]) * rank, group_id, rank, cuda=False)
        self.assertEqual(out, join(blocks))
        self._barrier()


class Suite(suite.TestDistBackend, suite.DistributedTest._DistTestBase, CpuAdapted):
    """torch's test case, built the way its spawned processes build it."""


def _between_tests() -> None:
    """torch's runner resets its file barrier before each test (Barrier.init in the parent)."""
    WORLD.Barrier()
    suite.Barrier.barrier_id = 0
    if RANK == 0:
        barrier_dir = os.path.join(args.temp_dir, "barrier")
        for name in os.listdir(barrier_dir):
            os.unlink(os.path.join(barrier_dir, name))
    WORLD.Barrier()


def _outcome(error: BaseException | None) -> tuple[str, str]:
    if error is None:
        return "pass", ""
    if isinstance(error, unittest.SkipTest):
        return "skip", str(error)
    if isinstance(error, SystemExit):  # torch's GPU-count decorators exit with a skip code
        code = error.code if isinstance(error.code, int) else 1
        return ("skip", f"exit code {code}") if code in SKIP_EXIT_CODES else ("error", f"exit code {code}")
    kind = "fail" if isinstance(error, AssertionError) else "error"
    return kind, "".join(traceback.format_exception_only(type(error), error)).strip()[-1500:]


def run_test(index: int, name: str) -> tuple[str, str]:
    error = None
    suite.BACKEND = args.backend if name in BY_NAME else "gloo"
    try:
        case = Suite(name)
        case.rank = RANK
        case.file_name = os.path.join(args.temp_dir, "init_dir", f"store-{index}")
        timeout = timedelta(seconds=suite.CUSTOM_PG_TIMEOUT.get(name, suite.default_pg_timeout))
        dist.init_process_group(init_method=case.init_method, backend=args.backend, world_size=SIZE, rank=RANK,
                                timeout=timeout)
        try:
            case._barrier()
            common_utils.set_rng_seed()  # as torch's runner does: tests draw the same "random" tensors on every rank
            getattr(case, name)()
            case._barrier()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every outcome is reported
        error = exc
    return _outcome(error)


def _watchdog(name: str, started: float, done: threading.Event) -> None:
    """Ends the whole job when a test (or the meeting before it) runs past the deadline: the other
    ranks may be waiting in MPI_COMM_WORLD for this one, which an exit alone would not end."""
    if not done.wait(args.deadline):
        report(kind="hang", test=name, seconds=round(time.monotonic() - started, 1))
        sys.stdout.flush()
        WORLD.Abort(3)


if args.list:  # the names as the class holds them (parametrized tests get theirs at import)
    names = list(vars(suite.DistributedTest._DistTestBase)) + list(vars(CpuAdapted))
    report(kind="tests", names=[name for name in names if name.startswith("test_")])
    sys.exit(0)
def _watched(name: str) -> threading.Event:
    """A watchdog over what follows, until the returned event is set."""
    done = threading.Event()
    threading.Thread(target=_watchdog, args=(name, time.monotonic(), done), daemon=True).start()
    return done


for index, name in enumerate(args.tests):
    # the meeting has its own deadline: a rank that ended the last test early waits here for the others
    met = _watched(f"(the meeting before {name})")
    _between_tests()
    met.set()
    done, started = _watched(name), time.monotonic()
    outcome, message = run_test(index, name)
    done.set()
    report(kind="result", test=name, outcome=outcome, seconds=round(time.monotonic() - started, 2), message=message)
