"""Job (4 ranks): ``ftcomm.torch.ZeroRedundancyOptimizer`` with the model's parameters on a stand-in
device (tests/gpu/fake_torch_device.py: host tensors the backend treats as device tensors, and
shard copies to the host that land on a thread after a delay, as on a side stream), so that the
device paths run without a GPU: the shard's state on the device (ftcomm/torch/zero/device_shard.py,
the default) and, with ``offload``, on the host (ftcomm/torch/zero/host_master.py).

compare: a host model, a "device" model and an offloaded "device" model, same seeds, same
    batches, DDP and AdamW ZeRO each; reports the largest difference of each device model's
    parameters and consolidated state from the host model's (the math is the same CPU kernels
    here: 0 expected), the copies each device path made, and whether a scrub of the replicas
    found a bad copy. Under FTCOMM_DATA_PLANE=gloo the
    "device" model's parameter allgather runs on its device tensors.
api: the same for SGD with momentum, Adagrad, RMSprop and ASGD, then (AdamW) a state dict loaded
    back, the scrub, and a param group added mid-training, each followed by steps: reports the
    largest differences and whether the device shard still equals the host one.
device_error: as kill, but world rank 1's device update raises a RuntimeError (as an out of
    memory error would) in step 3: that rank reports what it raised and dies; the others must see
    the step voided at once (not at a deadline) and go on without it.
kill [offload]: the "device" model alone in a resilient loop while FTCOMM_FAULT kills a rank;
    after each committed step every rank keeps a snapshot of its device parameters, and after
    the voided step reports whether they equal the snapshot bitwise. At the end: digests of the
    device parameters and of the engine's flat parameters, and whether the device copy of the
    live shard equals the host one bitwise.
"""
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from fake_torch_device import FakeTorchDevice
from ftcomm.torch.group import device
from harness import ddp_toy_data, report

dist.init_process_group("ftcomm")
fake = FakeTorchDevice()
device.use_ops_for_tests(fake)
_, _, _, loader = ddp_toy_data(384, 8)


def make(on_device: bool, offload: bool = False, cls=torch.optim.AdamW, **kwargs):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    if on_device:
        for p in model.parameters():
            fake.mark(p)
    ddp = DDP(model)
    kwargs = kwargs or {"lr": 1e-2, "weight_decay": 0.05}
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), cls, offload=offload, **kwargs)
    return model, ddp, opt


def train_step(ddp, opt, x, y):
    opt.zero_grad()
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def state_vector(opt) -> torch.Tensor:
    full = opt.full_state_dict()["state"]
    slots = opt.sharded.stepper.slots[1:]
    return torch.cat([full[i][k].reshape(-1).float() for i in sorted(full) for k in sorted(full[i])
                      if k in slots or full[i][k].dim() == 0])


def device_matches_host(opt) -> bool | None:
    """Whether the device copy of the live shard equals the engine's host one (None: offloaded)."""
    engine = opt.sharded
    if engine.device is None:
        return None
    return torch.equal(engine.device.live, torch.from_numpy(engine.live))


def compare_mode():
    batches = [b for _, b in zip(range(12), loader)]
    results = {}
    for name, on_device, offload in (("host", False, False), ("device", True, False), ("offload", True, True)):
        before = len(fake.events)
        model, ddp, opt = make(on_device, offload)
        for x, y, _ in batches:
            train_step(ddp, opt, x, y)
        events = fake.events[before:]
        results[name] = (model, opt, {kind: events.count(kind) for kind in (
            "to_host", "copy_back", "shard_to_host", "to_device", "to_host_async", "copy_on_device")})
    host_model, host_opt, _ = results["host"]
    out = {}
    for name in ("device", "offload"):
        model, opt, copies = results[name]
        out[name] = {"param_diff": max((a - b).abs().max().item()
                                       for a, b in zip(host_model.parameters(), model.parameters())),
                     "state_diff": (state_vector(host_opt) - state_vector(opt)).abs().max().item(),
                     "copies": copies, "on_device": opt.sharded.device is not None,
                     "device_matches_host": device_matches_host(opt),
                     # every replica against its owner's checksum: the wards' parameter slots
                     # are taken from the host flat parameters, which the device must have filled
                     "scrub_found": opt.sharded.check_state() is not None,
                     "moved": bool((model[0].weight - make(False)[0][0].weight).abs().max() > 0)}
    report(kind="compare", plane=dist.group.WORLD.data_plane.name, **out)


def differences(a, b) -> dict:
    """Largest differences of two (model, opt) pairs' parameters and states."""
    (model_a, opt_a), (model_b, opt_b) = a, b
    return {"param_diff": max((x - y).abs().max().item() for x, y in zip(model_a.parameters(), model_b.parameters())),
            "state_diff": (state_vector(opt_a) - state_vector(opt_b)).abs().max().item(),
            "device_matches_host": device_matches_host(opt_b)}


def api_mode():
    batches = [b for _, b in zip(range(4), loader)]

    def train(ddp, opt):
        for x, y, _ in batches:
            train_step(ddp, opt, x, y)

    out = {}
    for cls, kwargs in ((torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}), (torch.optim.Adagrad, {"lr": 0.05}),
                        (torch.optim.RMSprop, {"lr": 0.01}), (torch.optim.ASGD, {"lr": 0.05})):
        pairs = []
        for on_device in (False, True):
            model, ddp, opt = make(on_device, cls=cls, **kwargs)
            train(ddp, opt)
            pairs.append((model, opt))
        out[cls.__name__] = differences(*pairs)
    runs = []
    for on_device in (False, True):
        model, ddp, opt = make(on_device)
        train(ddp, opt)
        opt.load_state_dict(opt.full_state_dict())  # a state dict loaded back: a rebuilt live shard
        train(ddp, opt)
        scrubbed = opt.sharded.check_state()
        extra = nn.Parameter(torch.linspace(-1, 1, 10))
        if on_device:
            fake.mark(extra)
        opt.add_param_group({"params": [extra], "lr": 0.02})
        for x, y, _ in batches:
            opt.zero_grad()
            (nn.functional.cross_entropy(ddp(x), y) + (extra * extra).sum()).backward()
            opt.step()
        runs.append((model, opt, scrubbed, extra))
    (hm, ho, hs, he), (dm, do, ds, de) = runs
    out["AdamW"] = {**differences((hm, ho), (dm, do)), "scrub_found": [hs is not None, ds is not None],
                    "extra_diff": (he - de).abs().max().item(), "on_device": do.sharded.device is not None}
    report(kind="api", **out)


def fail_device_update(opt, world_rank: int, at_step: int) -> None:
    """Makes ``world_rank``'s device update raise once the engine reaches ``at_step``."""
    shard = opt.sharded.device
    update = shard.update

    def failing(stepper, host_staging, start, scalars):
        if dist.group.WORLD.comm.world_rank == world_rank and opt.sharded.step_id + 1 == at_step:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return update(stepper, host_staging, start, scalars)

    shard.update = failing


def kill_mode(offload: bool, device_error: bool = False):
    model, ddp, opt = make(True, offload)
    if device_error:
        fail_device_update(opt, world_rank=1, at_step=3)
    batches = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt)
    snapshot, voided = [p.detach().clone() for p in model.parameters()], []
    for epoch in batches.epochs(2):
        for x, y, _ in batches:
            try:
                train_step(ddp, opt, x, y)
            except RuntimeError as error:
                report(kind="raised", error=f"{type(error).__name__}: {error}", step=opt.sharded.step_id)
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            if batches.step_skipped:
                voided.append(all(torch.equal(a, b) for a, b in zip(model.parameters(), snapshot)))
            else:
                snapshot = [p.detach().clone() for p in model.parameters()]
    engine = opt.sharded
    report(kind="kill", voided=voided, size=dist.get_world_size(), device=digest(model.parameters()),
           engine=digest([torch.from_numpy(engine.flat[: engine.numel].copy())]), steps=engine.step_id,
           state=digest([state_vector(opt)]), device_matches_host=device_matches_host(opt))


if sys.argv[1] == "compare":
    compare_mode()
elif sys.argv[1] == "api":
    api_mode()
else:
    kill_mode(offload="offload" in sys.argv[2:], device_error=sys.argv[1] == "device_error")
