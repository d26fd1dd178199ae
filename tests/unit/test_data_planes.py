"""Which tensors each data plane moves as they are, where their allreduce goes, and where a
fault is injected in it (ftcomm/torch/group/data_plane.py). Device tensors are host tensors that a
stand-in marks as device ones (tests/gpu/fake_torch_device.py), so this runs without a GPU."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from fake_torch_device import installed  # noqa: E402

from ftcomm.torch.group.gloo_plane import GlooPlane  # noqa: E402
from ftcomm.torch.group.nccl_plane import NcclPlane  # noqa: E402
from ftcomm.torch.group.ring_plane import RingPlane  # noqa: E402


@pytest.fixture
def fake():
    with installed() as stand_in:
        yield stand_in


def test_each_plane_takes_and_injects_where_it_moves_the_bytes(fake):
    host, on_device = torch.ones(4), fake.mark(torch.ones(4))
    cases = {  # plane: (takes host, takes device, fault point for host, for device)
        RingPlane(): (True, False, "reduce_scatter", "reduce_scatter"),
        GlooPlane(): (True, True, "data_plane", "data_plane"),
        NcclPlane(): (True, True, "reduce_scatter", "data_plane"),
    }
    for plane, (takes_host, takes_device, host_point, device_point) in cases.items():
        assert plane.takes([host]) is takes_host, plane.name
        assert plane.takes([on_device]) is takes_device, plane.name
        assert plane.fault_point([host]) == host_point, plane.name
        assert plane.fault_point([on_device]) == device_point, plane.name
    # a bucket mixing host and device tensors is staged (no plane takes it as it is)
    assert not any(plane.takes([host, on_device]) for plane in cases)


def test_the_nccl_plane_sends_host_tensors_to_the_ring():
    class Comm:
        calls = []

        def allreduce(self, tensors, op, timeout, commit):
            self.calls.append((len(tensors), op, commit))
            return 7

    comm = Comm()
    assert NcclPlane().allreduce(comm, [torch.ones(3), torch.ones(2)], "avg", 5.0) == 7
    assert comm.calls == [(2, "avg", False)]  # uncommitted, as the ring plane's own


def test_the_gloo_plane_starts_an_allreduce_from_the_callers_thread_once_its_group_is_made():
    import ftcomm

    comm, plane = ftcomm.Communicator(timeout=20), GlooPlane()
    bucket = [torch.arange(6, dtype=torch.float32), torch.full((3,), 8.0)]
    # no inner group yet: making one broadcasts over the communicator, which the caller may not
    assert plane.start_allreduce(comm, bucket, "sum", 20) is None
    step = plane.allreduce(comm, bucket, "sum", 20)  # the queued route makes the group
    started = plane.start_allreduce(comm, bucket, "avg", 20)
    assert started is not None and started.step == step + 1  # recorded after the queued one
    results = []
    started.on_success(lambda: results.append([t.clone() for t in bucket]))
    assert started.watch() is None
    # world size 1: the sum is the input, and "avg" divides it by 1
    assert torch.equal(results[0][0], torch.arange(6, dtype=torch.float32))
    assert torch.equal(results[0][1], torch.full((3,), 8.0))
    assert plane.completed["allreduce"] == 2 and plane.groups_made == 1
    assert not plane.starts_inline([]) and not NcclPlane().starts_inline(bucket)
    assert RingPlane().start_allreduce(comm, bucket, "sum", 20) is None


class _FakeStarted:
    """What InnerGroupPlane.start_allreduce returns, with its outcome set by the test."""

    def __init__(self, step, error):
        self.step, self.error, self.callbacks = step, error, []

    def on_success(self, callback):
        self.callbacks.append(callback)

    def watch(self):
        return self.error


class _FakePlane:
    def __init__(self, error=None):
        self.started = []
        self.error = error

    def start_allreduce(self, comm, tensors, op, timeout):
        self.started.append(_FakeStarted(10 + len(self.started), self.error))
        return self.started[-1]


def test_the_step_commit_starts_a_bucket_only_with_nothing_queued_before_it():
    import threading

    from ftcomm.errors import ProcFailedError
    from ftcomm.torch.group import step_state
    from ftcomm.torch.group.executor import EXECUTOR
    from ftcomm.torch.group.step_commit import StepCommit

    if EXECUTOR.inline:
        pytest.skip("FTCOMM_TORCH_ASYNC=0: no communication thread")
    commit, plane, comm, bucket = StepCommit(group=type("G", (), {"timeout": 5.0})()), _FakePlane(), object(), [torch.ones(2)]
    release = threading.Event()
    EXECUTOR.submit(lambda: release.wait(10))  # a collective queued before the bucket
    try:
        assert commit.start(comm, "allreduce", bucket, "sum", plane) is None
        assert plane.started == []  # the bucket is queued behind it instead
    finally:
        release.set()
    assert EXECUTOR.drain(10)
    work = commit.start(comm, "allreduce", bucket, "sum", plane)
    assert len(plane.started) == 1 and commit.step == 10
    assert EXECUTOR.drain(10) and work.is_completed()  # the watch completes it if the transport did not yet
    plane.started[0].callbacks[0]()  # the transport's success after the watch's: completes it once only
    assert work.result() == bucket and commit.error is None

    failing = _FakePlane(error=ProcFailedError("a peer died", step=11))
    other = StepCommit(group=commit.group)
    work = other.start(comm, "allreduce", bucket, "sum", failing)
    assert EXECUTOR.drain(10) and work.is_completed() and work.exception() is None  # voided by the step, not the Work
    assert isinstance(other.error, ProcFailedError)
    # after this rank's failure in the step, its later buckets are skipped
    assert other.start(comm, "allreduce", bucket, "sum", failing).is_completed() and len(failing.started) == 1
    with step_state.STATE.lock:
        step_state.STATE.pending_commits.clear()  # the two StepCommits above settle nothing here


def test_a_watch_that_breaks_counts_as_a_failure_and_completes_the_work():
    from ftcomm.errors import ProcFailedError
    from ftcomm.torch.group import step_state
    from ftcomm.torch.group.executor import EXECUTOR
    from ftcomm.torch.group.step_commit import StepCommit

    class Broken(_FakeStarted):
        def watch(self):
            raise KeyError("the liveness table is gone")

    class Plane(_FakePlane):
        def start_allreduce(self, comm, tensors, op, timeout):
            self.started.append(Broken(20, None))
            return self.started[-1]

    commit, plane, bucket = StepCommit(group=type("G", (), {"timeout": 5.0})()), Plane(), [torch.ones(2)]
    work = commit.start(object(), "allreduce", bucket, "sum", plane)
    assert EXECUTOR.drain(10) and work.is_completed() and work.exception() is None
    assert isinstance(commit.error, ProcFailedError) and "liveness table" in str(commit.error)
    assert commit.error.step == 20 and not commit._watching  # the next step's buckets get a watch again
    with step_state.STATE.lock:
        step_state.STATE.pending_commits.clear()
