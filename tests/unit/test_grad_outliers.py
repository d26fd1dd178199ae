"""The gradient outlier check's verdicts (ftcomm/torch/checks/grad_outliers.py) on norms whose answer is
known, its policies, and the exponent flip used to inject silent corruption into a gradient."""
import math

import pytest
import torch

from ftcomm.core import fault
from ftcomm.torch.checks.grad_outliers import GradOutlierCheck, flip_exponent, outliers
from ftcomm.torch.loop.loader import ResilientLoader


def test_outliers_against_the_median_of_the_others():
    assert outliers([1.0, 1.2, 0.9, 150.0], ratio=100) == [3]
    assert outliers([1.0, 1.2, 0.9, 90.0], ratio=100) == []
    assert outliers([1.0, math.inf, 1.1, 0.8], ratio=100) == [1]
    assert outliers([math.nan, 1.0, 1.0], ratio=100) == [0]
    assert outliers([1.0, 500.0], ratio=100) == [1]      # 2 ranks: the larger one is the suspect
    assert outliers([3.0], ratio=100) == []               # one rank: nothing to compare
    assert outliers([0.0, 0.0, 0.0], ratio=100) == []     # all zero: no reference, no outlier


def test_floor_keeps_a_well_fit_batch_from_making_another_rank_an_outlier():
    norms = [0.002, 0.001, 0.003, 0.9]                    # three ranks' batches already fit
    assert outliers(norms, ratio=100) == [3]
    assert outliers(norms, ratio=100, floor=0.5) == []
    assert outliers([0.002, 0.001, 0.003, 60.0], ratio=100, floor=0.5) == [3]


def _bucket(sq_by_world_rank: dict, world: int = 4):
    """A reduced bucket buffer: [squared norms by world rank | 1 for each member]."""
    values = torch.zeros(2 * world, dtype=torch.float64)
    for rank, sq in sq_by_world_rank.items():
        values[rank], values[world + rank] = sq, 1.0
    return values


def _step(check, step, sq_by_rank):
    check.start_step(step)
    check.add_bucket(_bucket(dict(enumerate(sq_by_rank))))
    return check.judge()


def test_redo_policy_voids_once_then_applies_a_repeat_as_data():
    check = GradOutlierCheck("redo")
    assert _step(check, 1, [1.0, 1.0, 1.0, 1.0]) == (False, None)
    void, event = _step(check, 2, [1.0, 1.0, 1e40, 1.0])
    assert void and (event.step, event.ranks, event.action) == (2, [2], "voided and redone")
    assert check.judge() == (void, event)                 # a second optimizer gets the same verdict
    void, event = _step(check, 2, [1.0, 1.0, 1e40, 1.0])  # the redone step, out of line again
    assert not void and event.ranks == [2] and event.action.startswith("applied")
    void, event = _step(check, 3, [1.0, 1.0, 1e40, 1.0])  # a later step: voided once more
    assert void and event.action == "voided and redone"


def test_log_policy_applies_and_bucket_norms_add_up_over_the_members():
    check = GradOutlierCheck("log", ratio=10)
    check.start_step(7)
    check.add_bucket(_bucket({4: 1.0, 5: 1.0, 6: 0.0}, world=8))
    check.add_bucket(_bucket({4: 0.0, 5: 0.0, 6: 101.0}, world=8))  # world rank 6: sqrt(101) > 10 x 1
    assert check.verdict is None                                     # not judged yet
    void, event = check.judge()
    assert not void and (event.step, event.ranks, event.action) == (7, [6], "logged, applied")
    assert "6: 10" in event.checked and "0: " not in event.checked   # world ranks 0-3 and 7 took no part
    assert check.verdict == (void, event)


def test_history_moves_with_the_state_dict():
    """A promoted spare loads the survivors' recent typical norms and redone ranks, and then judges
    a step as they do."""
    old = GradOutlierCheck("redo")
    for step in range(1, 6):
        _step(old, step, [1.0, 1.2, 0.9, 1.1])
    new = GradOutlierCheck("redo")
    new.load_state_dict(old.state_dict())
    fitted = [1e-6, 1e-6, 1e-6, 0.8]  # three batches already fit: above 100x their median, not the floor
    assert _step(old, 6, fitted) == (False, None) and _step(new, 6, fitted) == (False, None)
    assert _step(GradOutlierCheck("redo"), 6, fitted)[0]  # without the history it would be voided


@pytest.mark.parametrize("policy,ratio", [("always", 100), ("redo", 1.0), ("log", -3)])
def test_bad_settings_are_refused(policy, ratio):
    with pytest.raises(ValueError, match="grad_outliers|outlier_ratio"):
        GradOutlierCheck(policy, ratio)


def test_resilient_refuses_a_model_that_is_not_ddp():
    with pytest.raises(ValueError, match="DistributedDataParallel module, not Linear"):
        ResilientLoader([], model=torch.nn.Linear(2, 2), grad_outliers="redo")


@pytest.mark.parametrize("dtype,shift", [(torch.float32, 128), (torch.float64, 1024), (torch.float16, 16),
                                         (torch.bfloat16, 128)])
def test_flip_exponent_multiplies_the_middle_element(dtype, shift):
    t = torch.full((5,), 0.75, dtype=dtype)
    fault.inject("test_exponent", rank=-1, kind="bitflip")
    try:
        assert flip_exponent("test_exponent", 0, 1, t)
        assert not flip_exponent("test_exponent", 0, 1, t)  # one-shot
    finally:
        fault.clear()
    assert t[2].double().item() == math.ldexp(0.75, shift)  # 0.75 x 2^shift: the top exponent bit set
    assert torch.equal(t[[0, 1, 3, 4]], torch.full((4,), 0.75, dtype=dtype))
