"""A plain optimizer's model and state kept in place in a node segment (ftcomm/torch/loop/model_memory.py):
one process, files under tmp_path. The relaunch that resumes from it runs in
tests/fault/test_relaunch_resume.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ftcomm import segment_paths  # noqa: E402
from ftcomm.torch.loop.model_memory import ModelMemory  # noqa: E402
from ftcomm.torch.group.step_state import STATE  # noqa: E402
from ftcomm.training import node_memory  # noqa: E402


@pytest.fixture
def memory(tmp_path, monkeypatch):
    monkeypatch.setenv("FTCOMM_SHM_DIR", str(tmp_path))
    return node_memory.NodeMemory(segment_paths.node_dir("n1", key="job-a"), world_rank=0, launch=0)


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _step(model, optimizer, seed):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _state(model, optimizer) -> list:
    out = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        out += [v.clone() for _, v in sorted(optimizer.state[p].items())]
    return out


def _committed_copy(memory, kept):
    kept._wait()
    copies = node_memory.scan_models(memory.directory, before_launch=1, engine=memory.engine)
    return copies


def test_the_optimizer_steps_in_the_segment_and_its_results_are_bitwise_those_of_private_memory(memory):
    model, optimizer = _model_and_optimizer()
    ref_model, ref_optimizer = _model_and_optimizer()
    kept = ModelMemory(optimizer, memory)
    _step(model, optimizer, 1)
    _step(ref_model, ref_optimizer, 1)
    kept.commit(1, world_rank=0, world_size=4)
    segment = kept._data
    lo, hi = segment.ctypes.data, segment.ctypes.data + segment.nbytes
    every = [p for p in model.parameters()] + [v for p in model.parameters() for v in optimizer.state[p].values()]
    assert all(lo <= t.data_ptr() < hi for t in every)  # the parameters and the moments are the segment
    for seed in (2, 3, 4):
        _step(model, optimizer, seed)
        _step(ref_model, ref_optimizer, seed)
        kept.commit(seed, world_rank=0, world_size=4)
        assert kept._data is segment  # no copy per step: the same segment, updated in place
    for mine, ref in zip(_state(model, optimizer), _state(ref_model, ref_optimizer)):
        assert torch.equal(mine, ref)
    (copy,) = _committed_copy(memory, kept)
    assert (copy.step, copy.meta["world_size"]) == (4, 4)
    assert np.array_equal(copy.data(), segment[: copy.meta["nbytes"]])


def test_the_update_clears_the_commit_word_and_a_voided_step_leaves_it(memory):
    model, optimizer = _model_and_optimizer()
    kept = ModelMemory(optimizer, memory)
    _step(model, optimizer, 1)
    kept.commit(1, 0, 1)
    assert [c.step for c in _committed_copy(memory, kept)] == [1]
    seen = []
    optimizer.register_step_pre_hook(  # runs after ModelMemory's: what a crash in the update would leave
        lambda *_: seen.append(node_memory.scan_models(memory.directory, 1, memory.engine)))
    _step(model, optimizer, 2)
    assert seen == [[]]  # half-written: no committed copy listed
    assert _committed_copy(memory, kept) == []
    kept.commit(2, 0, 1)
    assert [c.step for c in _committed_copy(memory, kept)] == [2]
    with STATE.lock:
        STATE.guards, STATE.poisoned = STATE.guards + 1, True  # a failure voided the running step
    try:
        kept._before_update(optimizer, (), {})  # the voided step's update changes nothing
    finally:
        with STATE.lock:
            STATE.guards, STATE.poisoned = STATE.guards - 1, False
    assert [c.step for c in _committed_copy(memory, kept)] == [2]


def test_a_damaged_copy_is_not_used(memory):
    model, optimizer = _model_and_optimizer()
    kept = ModelMemory(optimizer, memory)
    _step(model, optimizer, 1)
    kept.commit(1, 0, 1)
    (copy,) = _committed_copy(memory, kept)
    with torch.no_grad():
        next(model.parameters()).view(-1)[3] += 1.0  # a flipped value after the commit
    assert copy.data() is None


def test_new_tensors_from_a_load_move_into_a_new_segment(memory):
    model, optimizer = _model_and_optimizer()
    kept = ModelMemory(optimizer, memory)
    _step(model, optimizer, 1)
    kept.commit(1, 0, 1)
    first = kept._data
    other_model, other_optimizer = _model_and_optimizer(seed=5)
    _step(other_model, other_optimizer, 7)
    model.load_state_dict(other_model.state_dict())
    optimizer.load_state_dict(other_optimizer.state_dict())  # new private tensors for the moments
    kept.commit(7, 0, 1)
    assert kept._data is not first
    for mine, theirs in zip(_state(model, optimizer), _state(other_model, other_optimizer)):
        assert torch.equal(mine, theirs)
    (copy,) = _committed_copy(memory, kept)
    assert copy.step == 7 and copy.data() is not None
