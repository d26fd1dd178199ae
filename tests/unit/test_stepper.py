"""A shard's update by a torch.optim optimizer (ftcomm/training/stepper.py): stepping four shards
of a flat, padded buffer one by one must give bitwise what torch's optimizer gives on the whole
parameters, for every elementwise optimizer torch has, with two param groups whose boundary
falls inside a shard; optimizers that are not elementwise are refused with their reason."""
import numpy as np
import pytest
import torch

from ftcomm.training.stepper import GroupRange, ShardStepper, probe, resolve

ELEMENTWISE = [
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    (torch.optim.AdamW, dict(lr=1e-2, fused=True)),
    (torch.optim.Adam, dict(lr=1e-3, amsgrad=True, foreach=False)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=False)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1)),
    (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}),
    (torch.optim.ASGD, {}),
    (torch.optim.Rprop, {}),
    (torch.optim.Adadelta, {}),
]


def _sharded_run(cls, kwargs, numel=30, shard_len=8, steps=5):
    """(the whole parameters after ``steps`` steps of torch's optimizer, the same from shards)."""
    torch.manual_seed(0)
    full = torch.randn(numel)
    ref = [full[:12].clone(), full[12:].clone()]
    ref_opt = cls([{"params": [ref[0]]}, {"params": [ref[1]], "lr": 0.05}], **kwargs)
    stepper = ShardStepper(cls, kwargs, [GroupRange(0, 12, {}), GroupRange(12, numel, {"lr": 0.05})])
    shards = (numel + shard_len - 1) // shard_len
    padded = np.zeros(shards * shard_len, np.float32)
    padded[:numel] = full.numpy()
    live = [np.zeros((len(stepper.slots), shard_len), np.float32) for _ in range(shards)]
    for s in range(shards):
        live[s][0] = padded[s * shard_len:(s + 1) * shard_len]
    scalars = [None] * shards
    for _ in range(steps):
        grad = torch.randn(numel)
        for p, g in zip(ref, grad.split([12, numel - 12])):
            p.grad = g.clone()
        ref_opt.step()
        flat_grad = np.zeros_like(padded)
        flat_grad[:numel] = grad.numpy()
        for s in range(shards):
            out = np.empty_like(live[s])
            scalars[s] = stepper.update(live[s], flat_grad[s * shard_len:(s + 1) * shard_len], out,
                                        s * shard_len, scalars[s])
            live[s] = out
    return ref, ref_opt, stepper, np.concatenate(live, axis=1)[:, :numel], scalars


@pytest.mark.parametrize("cls,kwargs", ELEMENTWISE, ids=lambda v: getattr(v, "__name__", str(v)))
def test_sharded_update_equals_torch_bitwise(cls, kwargs):
    ref, ref_opt, stepper, state, scalars = _sharded_run(cls, kwargs)
    # A fused kernel rounds its vectorised body and its tail differently, so where a shard's
    # boundary falls changes the last bit; every other kernel is exact.
    rtol = 1e-6 if kwargs.get("fused") else 0
    np.testing.assert_allclose(state[0], torch.cat(ref).numpy(), rtol=rtol, atol=0)
    for i, slot in enumerate(stepper.slots[1:], start=1):
        want = torch.cat([ref_opt.state[p][slot] for p in ref]).numpy()
        np.testing.assert_allclose(state[i], want, rtol=rtol, atol=0, err_msg=slot)
    for group, p in enumerate(ref):  # scalars (step counts, ...) as torch's, on every shard
        for key in stepper.probe.scalars:
            want = float(ref_opt.state[p][key])
            assert all(s[group][key] == want for s in scalars), key


def test_update_is_out_of_place():
    stepper = ShardStepper(torch.optim.AdamW, {"lr": 0.1}, [GroupRange(0, 4, {})])
    live = np.ones((3, 4), np.float32)
    before = live.copy()
    stepper.update(live, np.full(4, 0.5, np.float32), np.empty_like(live), 0, None)
    np.testing.assert_array_equal(live, before)


def test_lr_change_reaches_the_next_update():
    stepper = ShardStepper(torch.optim.SGD, {"lr": 0.1}, [GroupRange(0, 4, {"lr": 0.1})])
    live, out = np.zeros((1, 4), np.float32), np.empty((1, 4), np.float32)
    stepper.set_hyper([{"lr": 0.5, "params": []}])
    stepper.update(live, np.ones(4, np.float32), out, 0, None)
    np.testing.assert_array_equal(out[0], np.full(4, -0.5, np.float32))


@pytest.mark.parametrize("cls,why", [
    (torch.optim.LBFGS, "closure"),
    (torch.optim.SparseAdam, "dense"),
    (torch.optim.Adafactor, "whole-tensor"),
])
def test_optimizers_that_are_not_elementwise_are_refused(cls, why):
    with pytest.raises(ValueError, match=why) as err:
        probe(cls, {})
    assert cls.__name__ in str(err.value)


def test_names_and_classes():
    assert resolve("sgd", {"lr": 1.0}) == (torch.optim.SGD, {"momentum": 0.9, "lr": 1.0})
    assert resolve(torch.optim.Adagrad, {}) == (torch.optim.Adagrad, {})
    with pytest.raises(ValueError, match="'lamb'"):
        resolve("lamb", {})
    with pytest.raises(ValueError, match="torch.optim.Optimizer class"):
        resolve(torch.nn.Linear, {})
