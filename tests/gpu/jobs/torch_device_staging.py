"""Job (4 ranks, ``check`` or ``abort``): the torch backend's collectives on stand-in device
tensors (tests/gpu/fake_torch_device.py), checked against the same collectives on host tensors.

check: each collective's device tensors were filled by a "kernel" still running when the
    collective was issued; the results must include what the kernel wrote (the communication
    thread waited for the stream), equal the host path's bitwise, and come through host copies.
abort: world rank 3 is killed in the allgather phase of the group's second allreduce (fault
    spec from the test); the survivors' Work fails and their device tensor is bitwise as before.
"""
import sys

import torch
import torch.distributed as dist

import ftcomm
import ftcomm.torch  # noqa: F401  (registers "ftcomm")
from fake_torch_device import FakeTorchDevice
from ftcomm.torch.group import device
from harness import report

dist.init_process_group("ftcomm")
RANK, N = dist.get_rank(), dist.get_world_size()
WORLD_RANK = dist.group.WORLD.comm.world_rank
fake = FakeTorchDevice()
device.use_ops_for_tests(fake)


def values(n, seed):
    g = torch.Generator().manual_seed(seed * 101 + RANK)
    return torch.randint(-50, 50, (n,), generator=g).float()


def late(shape, seed, delay=0.3):
    """A device tensor of zeros that a kernel fills with ``values`` ``delay`` s after the call."""
    t = fake.mark(torch.zeros(shape))
    want = values(t.numel(), seed).view(shape)
    fake.launch(lambda: t.copy_(want), delay)
    return t, want.clone()


def check_mode():
    errors = {}

    def check(name, got, want):
        if not torch.equal(got, want):
            errors[name] = f"max abs diff {(got - want).abs().max().item()}"

    t, host = late((1001,), 1)
    dist.all_reduce(t)
    dist.all_reduce(host)
    check("all_reduce", t, host)

    t, host = late((257,), 2)
    dist.broadcast(t, src=N - 1)
    dist.broadcast(host, src=N - 1)
    check("broadcast", t, host)

    t, host = late((33,), 3)
    outs = [fake.mark(torch.full((33,), -1.0)) for _ in range(N)]
    host_outs = [torch.empty(33) for _ in range(N)]
    dist.all_gather(outs, t)
    dist.all_gather(host_outs, host)
    for j in range(N):
        check(f"all_gather[{j}]", outs[j], host_outs[j])

    t, host = late((40,), 4)
    out, host_out = fake.mark(torch.full((N * 40,), -1.0)), torch.empty(N * 40)
    dist.all_gather_into_tensor(out, t)
    dist.all_gather_into_tensor(host_out, host)
    check("all_gather_into_tensor", out, host_out)

    t, host = late((N * 24,), 5)
    out, host_out = fake.mark(torch.full((24,), -1.0)), torch.empty(24)
    dist.reduce_scatter_tensor(out, t)
    dist.reduce_scatter_tensor(host_out, host)
    check("reduce_scatter_tensor", out, host_out)

    parts = [late((7,), 6 + j)[0] for j in range(N)]
    host_parts = [values(7, 6 + j) for j in range(N)]
    out, host_out = fake.mark(torch.full((7,), -1.0)), torch.empty(7)
    dist.reduce_scatter(out, parts)
    dist.reduce_scatter(host_out, host_parts)
    check("reduce_scatter", out, host_out)

    # Each collective: marker (calling thread), wait for the kernels, copies in, copy back:
    # after a marker, no copy-in before the wait.
    last, order_ok = None, True
    for event in fake.events:
        if event in ("marker", "wait"):
            last = event
        elif event == "to_host" and last != "wait":
            order_ok = False
    report(kind="check", errors=errors, order_ok=order_ok, copy_backs=fake.events.count("copy_back"),
           waits=fake.events.count("wait"))


def abort_mode():
    t = fake.mark(values(4096, 9))
    dist.all_reduce(t)  # the group's first allreduce (step 0) commits
    before = t.clone()
    backs = fake.events.count("copy_back")
    error = None
    try:
        dist.all_reduce(t)  # step 1: world rank 3 dies in its allgather phase
    except ftcomm.FtError as exc:
        error = type(exc).__name__
    report(kind="abort", error=error, untouched=bool(torch.equal(t, before)),
           copy_backs_after=fake.events.count("copy_back") - backs, size=dist.get_world_size())


{"check": check_mode, "abort": abort_mode}[sys.argv[1]]()
