"""Job (4 ranks): ``ftcomm.torch.ZeroRedundancyOptimizer`` with the model's parameters on a stand-in
device (tests/gpu/fake_torch_device.py: host tensors the backend treats as device tensors), so the
host-master path (ftcomm/torch/host_master.py) runs without a GPU.

compare: a host model and a "device" model, same seeds, same batches, DDP and AdamW ZeRO each;
    reports the largest difference of their parameters and of their consolidated states (the math
    is the same engine's: 0 expected), and the copies the device path made.
kill: the "device" model alone in a resilient loop while FTCOMM_FAULT kills a rank in a shard
    update; after each committed step every rank keeps a snapshot of its device parameters, and
    after the voided step reports whether they equal the snapshot bitwise. At the end: digests of
    the device parameters and of the engine's flat parameters.
"""
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm.torch
from fake_torch_device import FakeTorchDevice
from ftcomm.torch import device
from harness import ddp_toy_data, report

dist.init_process_group("ftcomm")
fake = FakeTorchDevice()
device.use_ops_for_tests(fake)
_, _, _, loader = ddp_toy_data(384, 8)


def make(on_device: bool):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    if on_device:
        for p in model.parameters():
            fake.mark(p)
    ddp = DDP(model)
    opt = ftcomm.torch.ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-2, weight_decay=0.05)
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


def compare_mode():
    host_model, host_ddp, host_opt = make(False)
    dev_model, dev_ddp, dev_opt = make(True)
    for step, (x, y, _) in enumerate(loader):
        if step == 12:
            break
        train_step(host_ddp, host_opt, x, y)
        train_step(dev_ddp, dev_opt, x, y)
    diff = max((a - b).abs().max().item() for a, b in zip(host_model.parameters(), dev_model.parameters()))
    states = []
    for opt in (host_opt, dev_opt):
        full = opt.full_state_dict()["state"]
        states.append(torch.cat([full[i][k].reshape(-1) for i in sorted(full) for k in ("exp_avg", "exp_avg_sq")]))
    report(kind="compare", param_diff=diff, state_diff=(states[0] - states[1]).abs().max().item(),
           grads_to_host=fake.events.count("to_host"), params_to_device=fake.events.count("copy_back"),
           moved=bool((dev_model[0].weight - make(False)[0][0].weight).abs().max() > 0))


def kill_mode():
    model, ddp, opt = make(True)
    batches = ftcomm.torch.resilient(loader, model=ddp, optimizer=opt)
    snapshot, voided = [p.detach().clone() for p in model.parameters()], []
    for epoch in batches.epochs(2):
        for x, y, _ in batches:
            train_step(ddp, opt, x, y)
            if batches.step_skipped:
                voided.append(all(torch.equal(a, b) for a, b in zip(model.parameters(), snapshot)))
            else:
                snapshot = [p.detach().clone() for p in model.parameters()]
    engine = opt.sharded
    report(kind="kill", voided=voided, size=dist.get_world_size(), device=digest(model.parameters()),
           engine=digest([torch.from_numpy(engine.flat[: engine.numel].copy())]), steps=engine.step_id)


{"compare": compare_mode, "kill": kill_mode}[sys.argv[1]]()
