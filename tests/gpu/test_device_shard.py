"""``DeviceShard`` (ftcomm/torch/zero/device_shard.py) on one process with a stand-in device: the shard's
gradient slice, the step into host memory, and host buffers over torch-owned (page-locked on a
GPU machine) memory. Runs everywhere."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fake_torch_device import installed  # noqa: E402
from ftcomm.torch.zero.device_shard import DeviceShard  # noqa: E402
from ftcomm.training import storage  # noqa: E402
from ftcomm.training.layout import ShardLayout  # noqa: E402
from ftcomm.training.stepper import GroupRange, ShardStepper  # noqa: E402


@pytest.fixture
def fake():
    with installed() as stand_in:
        yield stand_in


def _params(fake, sizes, with_grad):
    gen = torch.Generator().manual_seed(3)
    params = []
    for n, has in zip(sizes, with_grad):
        p = fake.mark(torch.randn(n, generator=gen).requires_grad_())
        p.grad = torch.randn(n, generator=gen) if has else None
        params.append(p)
    return params


@pytest.mark.parametrize("size", [1, 3, 4])
def test_gradient_slice_of_every_shard(fake, size):
    params = _params(fake, (5, 7, 3), (True, False, True))
    shard = DeviceShard(params)
    layout = ShardLayout(15, tuple(range(size)))
    full = np.concatenate([np.zeros(p.numel(), np.float32) if p.grad is None else p.grad.numpy() for p in params])
    padded = np.zeros(layout.padded, np.float32)
    padded[:15] = full
    for rank in range(size):
        shard.adopt(np.zeros((2, layout.shard_len), np.float32))
        shard.grad.fill_(7.0)  # stale values from another step must not survive
        shard.gather_grads(layout, rank)
        start = layout.start(rank)
        assert np.array_equal(shard.grad.numpy(), padded[start:start + layout.shard_len])


def test_update_writes_the_host_staging_only_through_the_copy(fake):
    fake.copy_delay = 0.05
    params = _params(fake, (6, 4), (True, True))
    stepper = ShardStepper(torch.optim.AdamW, {"lr": 0.1}, [GroupRange(0, 10, {})])
    layout = ShardLayout(10, (0,))
    live = np.zeros((3, 10), np.float32)
    live[0] = torch.cat([p.detach() for p in params]).numpy()
    shard = DeviceShard(params)
    shard.adopt(live)
    shard.gather_grads(layout, 0)
    host_staging = np.full_like(live, -1.0)
    expected = np.empty_like(live)
    scalars = stepper.update(live, shard.grad.clone().numpy(), expected, 0, None)
    assert shard.update(stepper, host_staging, 0, None) == scalars
    shard.wait_params()
    assert np.array_equal(host_staging[0], expected[0])
    shard.wait_state()
    assert np.array_equal(host_staging, expected)
    assert np.array_equal(shard.live.numpy(), live)  # out of place: the live shard is the committed one
    shard.committed()
    assert np.array_equal(shard.live.numpy(), expected)


def test_refuses_parameters_on_several_devices_or_not_float32():
    with pytest.raises(ValueError, match="float32 parameters on one device"):
        DeviceShard([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])


def test_host_buffers_over_torch_memory_are_reused():
    a = storage.allocate((2, 6), 16, zeros=lambda n, used: torch.zeros(n, dtype=torch.float32).numpy())
    assert a.shape == (2, 6) and not a.any() and storage.storage(a).size == 16
    b = storage.reuse(a, (2, 8))
    assert b is not None and np.shares_memory(a, b)
    assert storage.reuse(a, (2, 9)) is None


def test_device_buffers_keep_room_for_a_shrink(fake):
    shard = DeviceShard(_params(fake, (8,), (True,)))
    first = storage.allocate((2, 4), 12)  # a host shard with room for one shrink (4 -> 6 elements)
    first[:] = np.arange(8, dtype=np.float32).reshape(2, 4)
    shard.adopt(first)
    memory = [m.data_ptr() for m in shard._memory]
    grown = storage.reuse(first, (2, 6))
    grown[:] = np.arange(12, dtype=np.float32).reshape(2, 6)
    shard.adopt(grown)  # the shrink: the same device memory, the new values
    assert [m.data_ptr() for m in shard._memory] == memory
    assert np.array_equal(shard.live.numpy(), grown) and shard.grad.shape == (6,)
    shard.adopt(np.ones((2, 9), np.float32))  # outgrown: new memory
    assert np.array_equal(shard.live.numpy(), np.ones((2, 9))) and shard.staging.shape == (2, 9)
