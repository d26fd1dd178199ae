"""One-process checks of the pieces that let a promoted spare join a DDP job (ftcomm/torch/loop/join.py):
a joining group completes DDP's constructor collectives locally and refuses reductions, the
hand-over payload restores model, optimizer, scheduler and RNG bitwise, a newcomer with another
model is refused, a loop a spare could not join is refused, and the backend's policy choice."""
import pytest

torch = pytest.importorskip("torch")
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ftcomm  # noqa: E402
import ftcomm.torch as ft  # noqa: E402
from ftcomm.torch.loop import join  # noqa: E402


def make_model(seed: int, hidden: int = 8):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))


def trained(seed: int):
    """A model, AdamW and StepLR after three steps (non-trivial moments, step counts, LR)."""
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


@pytest.fixture()
def joining_group():
    return ft.ProcessGroupFtcomm(ftcomm.Communicator(), timeout=10, policy="spares", joining=True)


def test_joining_group_runs_ddp_constructor_locally(joining_group):
    model = make_model(0)
    before = [p.detach().clone() for p in model.parameters()]
    ddp = DDP(model, process_group=joining_group)  # parameter check (allgather) + broadcasts
    assert all(torch.equal(a, p) for a, p in zip(before, ddp.module.parameters()))
    out = [torch.empty(3, dtype=torch.int64)]
    joining_group.allgather([out], [torch.tensor([7, 8, 9])]).wait()
    assert out[0].tolist() == [7, 8, 9]
    flat = torch.empty(3)
    joining_group._allgather_base(flat, torch.tensor([1.0, 2.0, 3.0])).wait()
    assert flat.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="allreduce on a promoted spare before it joined"):
        joining_group.allreduce([torch.ones(2)])


def test_hand_over_payload_restores_state_bitwise():
    src_model, src_opt, src_sched = trained(1)
    payload = join._pack(src_model, src_opt, [src_sched], {"epoch": 3, "rest": [5, 1, 4]})
    expected_rng = torch.get_rng_state()
    torch.manual_seed(99)  # the newcomer's own RNG, to be replaced
    model = make_model(2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    state = join._unpack(payload, model, opt, [sched])
    assert state == {"epoch": 3, "rest": [5, 1, 4]}
    assert all(torch.equal(a, b) for a, b in zip(src_model.parameters(), model.parameters()))
    for p_src, p in zip(src_model.parameters(), model.parameters()):
        s_src, s = src_opt.state[p_src], opt.state[p]
        assert sorted(s_src) == sorted(s)
        assert all(torch.equal(s_src[k], s[k]) for k in s)
    assert sched.get_last_lr() == src_sched.get_last_lr() and sched.last_epoch == 3
    assert torch.equal(torch.get_rng_state(), expected_rng)


def test_hand_over_payload_refuses_another_model():
    src_model, src_opt, src_sched = trained(1)
    payload = join._pack(src_model, src_opt, [src_sched], {"epoch": 0, "rest": []})
    model = make_model(2, hidden=9)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="size mismatch"):
        join._unpack(payload, model, opt, [torch.optim.lr_scheduler.StepLR(opt, 2)])
    with pytest.raises(ValueError, match="extra state"):
        join._unpack(payload, make_model(3), torch.optim.AdamW(make_model(3).parameters()), [])
    other = make_model(3)
    sgd = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)  # same groups, another optimizer
    with pytest.raises(ValueError, match="SGD"):
        join._unpack(payload, other, sgd, [torch.optim.lr_scheduler.StepLR(sgd, 2)])


class _FakeGroup:
    policy, joining, generation = "spares", False, 0


def test_loop_a_spare_cannot_join_is_refused():
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)), batch_size=2)
    loader = ft.resilient(data)
    with pytest.raises(ValueError) as info:
        loader._check_joinable(_FakeGroup(), can_resplit=False)
    for needed in ("model", "optimizer", "DistributedSampler", "loader.epochs(E)"):
        assert needed in str(info.value)
    ready = ft.resilient(data, model=make_model(0), optimizer=object())
    ready._in_epochs = True
    assert ready._check_joinable(_FakeGroup(), can_resplit=True) is True
    static = ft.resilient(data, model=torch.nn.Module(), optimizer=object())
    static.model.static_graph, static._in_epochs = True, True
    with pytest.raises(ValueError, match="static_graph"):
        static._check_joinable(_FakeGroup(), can_resplit=True)
    shrink = _FakeGroup()
    shrink.policy = "shrink"
    assert loader._check_joinable(shrink, can_resplit=False) is False
    with pytest.raises(ValueError, match="count"):
        next(iter(ready.epochs(-1)))


@pytest.mark.parametrize("spares,env,expected", [
    ("0", None, "shrink"), ("1", None, "spares"), ("1", "shrink", "shrink"), ("0", "spares", "shrink"),
    ("1", "respawn", "spares"),
])
def test_recovery_policy(monkeypatch, spares, env, expected):
    monkeypatch.setenv("FTCOMM_SPARES", spares)
    if env is None:
        monkeypatch.delenv("FTCOMM_RECOVERY_POLICY", raising=False)
    else:
        monkeypatch.setenv("FTCOMM_RECOVERY_POLICY", env)
    assert ft.recovery_policy() == expected


def test_payload_keeps_the_structure_with_tensors_in_host_memory():
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    w = torch.ones(3, requires_grad=True)
    value = {"x": [w, (1, Pair(torch.zeros(2), "s"))], "n": 4}
    out = join._on_host(value)
    assert out["n"] == 4 and isinstance(out["x"][1], tuple) and isinstance(out["x"][1][1], Pair)
    assert not out["x"][0].requires_grad and out["x"][0].device.type == "cpu"
    assert torch.equal(out["x"][0], w.detach()) and out["x"][1][1].b == "s"
