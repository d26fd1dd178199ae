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
