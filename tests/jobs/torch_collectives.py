"""Job (2-4 ranks): every collective of the ftcomm torch backend against gloo's result in the same
job (allreduce, broadcast, the allgathers and reduce-scatters and their coalesced forms, reduce,
gather, scatter, all-to-all), point-to-point against the values sent, unsupported ops, bad input
refused on every rank, and DDP
gradients/parameters after AdamW steps with ftcomm vs gloo."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ftcomm
import ftcomm.torch  # noqa: F401  (registers "ftcomm")
from harness import report

dist.init_process_group("ftcomm")
GLOO = dist.new_group(backend="gloo")
FT = dist.group.WORLD
RANK, N = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp


def data(shape, dtype, seed, rank=None):
    """Rank ``rank``'s (default this rank's) test tensor for ``seed``."""
    g = torch.Generator().manual_seed(seed * 97 + (RANK if rank is None else rank))
    # small integers: every reduction order gives the same floating-point result
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() if a.numel() else 0.0


errors = {}
checks = 0


def check(name, got, want, exact=True):
    global checks
    checks += 1
    if got.shape != want.shape or got.dtype != want.dtype:
        errors[name] = f"shape/dtype {tuple(got.shape)}/{got.dtype} vs {tuple(want.shape)}/{want.dtype}"
    elif exact and not torch.equal(got, want):
        errors[name] = f"differs, max rel err {rel_err(got, want):.3g}"
    elif not exact and rel_err(got, want) > 1e-6:
        errors[name] = f"max rel err {rel_err(got, want):.3g}"


# allreduce: sum, min, max, product; avg against gloo's sum / N (gloo has no AVG)
for dtype in (torch.float32, torch.float64, torch.int64):
    for op, name in ((R.SUM, "sum"), (R.MIN, "min"), (R.MAX, "max"), (R.PRODUCT, "prod")):
        x = data((1000 + 7,), dtype, 1)
        if op == R.PRODUCT:
            x = x.clamp(1, 3)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=op, group=FT)
        dist.all_reduce(b, op=op, group=GLOO)
        check(f"allreduce_{name}_{dtype}", a, b)
x = data((513,), torch.float32, 2)
a, b = x.clone(), x.clone()
work = dist.all_reduce(a, op=R.AVG, async_op=True)
fut_value = work.get_future().wait()
work.wait()
dist.all_reduce(b, group=GLOO)
check("allreduce_avg_float32", a, b / N, exact=False)
check("future_value_is_output", fut_value[0], a)

# broadcast (any dtype) from each root
for root in range(N):
    for dtype in (torch.float32, torch.uint8, torch.bool):
        x = data((33, 5), torch.int64, 3 + root).abs().to(dtype)
        a, b = x.clone(), x.clone()
        dist.broadcast(a, src=root, group=FT)
        dist.broadcast(b, src=root, group=GLOO)
        check(f"broadcast_root{root}_{dtype}", a, b)
# broadcast of a non-contiguous tensor
x = data((6, 8), torch.float32, 4)
a, b = x.clone().t(), x.clone().t()
dist.broadcast(a, src=N - 1, group=FT)
dist.broadcast(b, src=N - 1, group=GLOO)
check("broadcast_noncontiguous", a, b)

# allgather (list) and all_gather_into_tensor
x = data((10, 3), torch.float32, 5)
outs_a = [torch.empty_like(x) for _ in range(N)]
outs_b = [torch.empty_like(x) for _ in range(N)]
dist.all_gather(outs_a, x, group=FT)
dist.all_gather(outs_b, x, group=GLOO)
for j in range(N):
    check(f"all_gather_{j}", outs_a[j], outs_b[j])
x = data((257,), torch.bfloat16, 6)
a, b = torch.empty(N * 257, dtype=torch.bfloat16), torch.empty(N * 257, dtype=torch.bfloat16)
dist.all_gather_into_tensor(a, x, group=FT)
dist.all_gather_into_tensor(b, x, group=GLOO)
check("all_gather_into_tensor_bf16", a, b)
a = torch.empty(N * 257, dtype=torch.bfloat16)
FT._allgather_base(a, x).wait()
check("_allgather_base", a, b)
a = torch.zeros(N * 257, dtype=torch.bfloat16)  # the in-place form: the input is this rank's block
a[RANK * 257:(RANK + 1) * 257] = x
dist.all_gather_into_tensor(a, a[RANK * 257:(RANK + 1) * 257], group=FT)
check("all_gather_into_tensor_in_place", a, b)

# reduce_scatter (list) and reduce_scatter_tensor; inputs must stay unchanged
ins = [data((4, 5), torch.float32, 7 + j) for j in range(N)]
keep = [t.clone() for t in ins]
a, b = torch.empty(4, 5), torch.empty(4, 5)
dist.reduce_scatter(a, ins, group=FT)
check("reduce_scatter_inputs_untouched", torch.stack(ins), torch.stack(keep))
dist.reduce_scatter(b, ins, group=GLOO)
check("reduce_scatter_sum", a, b)
x = data((N * 100,), torch.float64, 8)
x0 = x.clone()
a, b = torch.empty(100, dtype=torch.float64), torch.empty(100, dtype=torch.float64)
dist.reduce_scatter_tensor(a, x, op=R.MAX, group=FT)
dist.reduce_scatter_tensor(b, x, op=R.MAX, group=GLOO)
check("reduce_scatter_tensor_max", a, b)
check("reduce_scatter_tensor_input_untouched", x, x0)
a = torch.empty(100, dtype=torch.float64)
FT._reduce_scatter_base(a, x).wait()
dist.reduce_scatter_tensor(b, x, group=GLOO)
check("_reduce_scatter_base_sum", a, b)
y = x.clone()  # the in-place form: the output is this rank's block of the input
mine = y[dist.get_rank() * 100:(dist.get_rank() + 1) * 100]
dist.reduce_scatter_tensor(mine, y, group=FT)
check("reduce_scatter_tensor_in_place", mine, b)

# reduce from each root (the other ranks' tensors unchanged), gather, scatter
for root in range(N):
    for op, name in ((R.SUM, "sum"), (R.MAX, "max")):
        x = data((300,), torch.float32, 20 + root)
        a, b = x.clone(), x.clone()
        dist.reduce(a, dst=root, op=op, group=FT)
        dist.reduce(b, dst=root, op=op, group=GLOO)
        check(f"reduce_{name}_root{root}", a, b if RANK == root else x)
    x = data((4, 3), torch.int64, 24 + root)
    outs_a = [torch.empty_like(x) for _ in range(N)] if RANK == root else None
    outs_b = [torch.empty_like(x) for _ in range(N)] if RANK == root else None
    dist.gather(x, outs_a, dst=root, group=FT)
    dist.gather(x, outs_b, dst=root, group=GLOO)
    if RANK == root:
        for j in range(N):
            check(f"gather_root{root}_{j}", outs_a[j], outs_b[j])
    ins = [data((5,), torch.float64, 28 + root * N + j) for j in range(N)] if RANK == root else None
    a, b = torch.empty(5, dtype=torch.float64), torch.empty(5, dtype=torch.float64)
    dist.scatter(a, ins, src=root, group=FT)
    dist.scatter(b, ins, src=root, group=GLOO)
    check(f"scatter_root{root}", a, b)

# all_to_all_single: even blocks, uneven splits (rank i sends i + j + 1 rows to rank j), and the
# list form with blocks of different sizes
x = data((N * 3, 2), torch.float32, 50)
a, b = torch.empty_like(x), torch.empty_like(x)
dist.all_to_all_single(a, x, group=FT)
dist.all_to_all_single(b, x, group=GLOO)
check("all_to_all_single_even", a, b)
send = [RANK + j + 1 for j in range(N)]
recv = [j + RANK + 1 for j in range(N)]
x = data((sum(send), 3), torch.int32, 51)
a, b = torch.empty(sum(recv), 3, dtype=torch.int32), torch.empty(sum(recv), 3, dtype=torch.int32)
dist.all_to_all_single(a, x, output_split_sizes=recv, input_split_sizes=send, group=FT)
dist.all_to_all_single(b, x, output_split_sizes=recv, input_split_sizes=send, group=GLOO)
check("all_to_all_single_uneven", a, b)
ins = [data((2, 3), torch.float32, 52 + j) for j in range(N)]
outs_a = [torch.empty(2, 3) for _ in range(N)]
outs_b = [torch.empty(2, 3) for _ in range(N)]
dist.all_to_all(outs_a, ins, group=FT)
dist.all_to_all(outs_b, ins, group=GLOO)
for j in range(N):
    check(f"all_to_all_{j}", outs_a[j], outs_b[j])
# blocks of different sizes (gloo's list form takes equal ones only): rank i sends i + 2j + 1
# elements to rank j
ins = [data((RANK + 2 * j + 1,), torch.int64, 56 + j) for j in range(N)]
outs_a = [torch.empty(j + 2 * RANK + 1, dtype=torch.int64) for j in range(N)]
dist.all_to_all(outs_a, ins, group=FT)
for j in range(N):
    check(f"all_to_all_uneven_{j}", outs_a[j], data((j + 2 * RANK + 1,), torch.int64, 56 + RANK, rank=j))

# coalesced allgathers and reduce-scatters (torch's coalescing manager), against gloo one by one
xs = [data((7,), torch.float32, 60), data((2, 3), torch.float32, 61)]
outs_a = [torch.empty(N * t.numel()) for t in xs]
with dist._coalescing_manager(group=FT):
    for o, t in zip(outs_a, xs):
        dist.all_gather_into_tensor(o, t.reshape(-1), group=FT)
for j, (o, t) in enumerate(zip(outs_a, xs)):
    b = torch.empty(N * t.numel())
    dist.all_gather_into_tensor(b, t.reshape(-1), group=GLOO)
    check(f"all_gather_into_tensor_coalesced_{j}", o, b)
xs = [data((N * 4,), torch.float32, 62), data((N * 2,), torch.float32, 63)]
outs_a = [torch.empty(t.numel() // N) for t in xs]
with dist._coalescing_manager(group=FT):
    for o, t in zip(outs_a, xs):
        dist.reduce_scatter_tensor(o, t, group=FT)
for j, (o, t) in enumerate(zip(outs_a, xs)):
    b = torch.empty(t.numel() // N)
    dist.reduce_scatter_tensor(b, t, group=GLOO)
    check(f"reduce_scatter_tensor_coalesced_{j}", o, b)
ins = [data((3,), torch.float32, 64), data((2,), torch.float32, 65)]
outs_a = [[torch.empty_like(t) for t in ins] for _ in range(N)]  # [rank][tensor], as torch lays it out
dist.all_gather_coalesced(outs_a, ins, group=FT)
outs_b = [[torch.empty_like(t) for t in ins] for _ in range(N)]
dist.all_gather_coalesced(outs_b, ins, group=GLOO)
for i in range(N):
    for j in range(len(ins)):
        check(f"all_gather_coalesced_{i}_{j}", outs_a[i][j], outs_b[i][j])

# a sparse allreduce (SUM): each rank's own nonzeros (rank + 1 of them, overlapping), against the
# dense sum on gloo
sparse = torch.sparse_coo_tensor(torch.tensor([list(range(RANK + 1)), [RANK] * (RANK + 1)]),
                                 data((RANK + 1, 3), torch.float64, 66), (N + 1, N, 3))
dense = sparse.to_dense()
dist.all_reduce(sparse, group=FT)
dist.all_reduce(dense, group=GLOO)
check("sparse_allreduce", sparse.to_dense(), dense)

# point-to-point: a ring exchange by batch_isend_irecv (sends and receives posted in either
# order), two messages between the same ranks under two tags received in the other order, a
# 16 MiB message, receives from any source, and a message longer than the receiving tensor
x = data((1000,), torch.float64, 70)
y = torch.empty(1000, dtype=torch.float64)
ops = [dist.P2POp(dist.isend, x, (RANK + 1) % N, tag=1), dist.P2POp(dist.irecv, y, (RANK - 1) % N, tag=1)]
for work in dist.batch_isend_irecv(ops if RANK % 2 else ops[::-1]):
    work.wait()
check("batch_isend_irecv_ring", y, data((1000,), torch.float64, 70, rank=(RANK - 1) % N))
if RANK == 0:
    first, second = dist.isend(torch.full((3,), 1.0), 1, tag=11), dist.isend(torch.full((5,), 2.0), 1, tag=12)
    first.wait()
    second.wait()
elif RANK == 1:
    a, b = torch.empty(5), torch.empty(3)
    dist.recv(a, 0, tag=12)
    dist.recv(b, 0, tag=11)
    check("recv_by_tag", torch.cat([a, b]), torch.tensor([2.0] * 5 + [1.0] * 3))
big = data((4 << 20,), torch.float32, 71)
got = torch.empty(4 << 20)
if RANK == N - 1:
    dist.send(big, 0)
elif RANK == 0:
    dist.recv(got, N - 1)
    check("send_recv_16MiB", got, data((4 << 20,), torch.float32, 71, rank=N - 1))
if RANK == 0:
    seen = {}
    for _ in range(N - 1):
        t = torch.empty(4, dtype=torch.int32)
        src = dist.recv(t, tag=20)
        seen[src] = t.tolist()
    check("recv_anysource", torch.tensor([seen.get(j, [0] * 4) for j in range(1, N)], dtype=torch.int32),
          torch.tensor([[10 * j] * 4 for j in range(1, N)], dtype=torch.int32))
else:
    dist.send(torch.full((4,), 10 * RANK, dtype=torch.int32), 0, tag=20)
p2p_errors = {}
if RANK == 1:
    dist.send(torch.ones(6), 0, tag=30)
elif RANK == 0:
    try:
        dist.recv(torch.empty(4), 1, tag=30)
        p2p_errors["too_long"] = "no error"
    except ftcomm.InvalidInputError as exc:
        p2p_errors["too_long"] = "ok" if "larger than the tensor" in str(exc) else str(exc)
for name, fn in {"tag": lambda: dist.send(torch.ones(1), (RANK + 1) % N, tag=7000),
                 "peer": lambda: FT.send([torch.ones(1)], RANK, 0)}.items():
    try:
        fn()
        p2p_errors[name] = "no error"
    except ValueError as exc:
        p2p_errors[name] = "ok" if ("7000" in str(exc) if name == "tag" else "not another rank" in str(exc)) \
            else str(exc)

dist.barrier()
barrier_work = FT.barrier()
barrier_ok = barrier_work.wait() and barrier_work.is_completed() and barrier_work.is_success()

# unsupported ops fail clearly (on every rank, before any communication)
unsupported = {}
attempts = {
    "BAND": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=R.BAND),
}
for name, fn in attempts.items():
    try:
        fn()
        unsupported[name] = "no error"
    except NotImplementedError as exc:
        unsupported[name] = "ok" if name in str(exc) else f"message does not name it: {exc}"
    except Exception as exc:  # noqa: BLE001
        unsupported[name] = f"{type(exc).__name__}: {exc}"


# a tensor of the wrong size (or empty) on rank 1 only: InvalidInputError on every rank, naming
# world rank 1, from the collective's input check; the group stays usable (the next all_reduce
# matches gloo's)
BAD = 1


def sized(good, bad):
    return torch.zeros(bad if RANK == BAD else good)


bad_cases = {
    "broadcast_empty": lambda: dist.broadcast(sized(4, 0), src=0),
    "all_gather_empty": lambda: dist.all_gather([torch.empty(3 if RANK != BAD else 0) for _ in range(N)],
                                                sized(3, 0)),
    "all_gather_into_tensor_output": lambda: dist.all_gather_into_tensor(sized(N * 3, N * 3 + 1), torch.ones(3)),
    "reduce_scatter_tensor_output": lambda: dist.reduce_scatter_tensor(sized(3, 2), torch.ones(N * 3)),
    "reduce_scatter_input": lambda: dist.reduce_scatter(torch.empty(3), [sized(3, 4)] + [torch.ones(3)] * (N - 1)),
    # the root (rank 1) holds an output, or an input, of the wrong size
    "gather_output": lambda: dist.gather(torch.ones(3), [sized(3, 4) for _ in range(N)] if RANK == BAD else None,
                                         dst=BAD),
    "scatter_input": lambda: dist.scatter(torch.empty(3), [sized(3, 2) for _ in range(N)] if RANK == BAD else None,
                                          src=BAD),
    # rank 1 sends 2 rows to rank 0, which expects 1
    "all_to_all_single_splits": lambda: dist.all_to_all_single(
        torch.empty(N), torch.ones(N + (1 if RANK == BAD else 0)), output_split_sizes=[1] * N,
        input_split_sizes=[2 if j == 0 else 1 for j in range(N)] if RANK == BAD else [1] * N),
    # sparse: rank 1's values are int32 where the others' are float32 (the same size), then its
    # shape is another
    "sparse_dtype": lambda: dist.all_reduce(torch.sparse_coo_tensor(
        [[0]], torch.ones(1, dtype=torch.int32 if RANK == BAD else torch.float32), (4,))),
    "sparse_shape": lambda: dist.all_reduce(torch.sparse_coo_tensor([[0]], torch.ones(1), (5 if RANK == BAD else 4,))),
}
bad_input = {}
for name, fn in bad_cases.items():
    try:
        fn()
        bad_input[name] = "no error"
    except ftcomm.InvalidInputError as exc:
        bad_input[name] = "ok" if f"world rank {BAD}" in str(exc) else f"does not name world rank {BAD}: {exc}"
    except Exception as exc:  # noqa: BLE001
        bad_input[name] = f"{type(exc).__name__}: {exc}"
    t, ref = data((7,), torch.float32, 40), data((7,), torch.float32, 40)
    dist.all_reduce(t, group=FT)
    dist.all_reduce(ref, group=GLOO)
    check(f"all_reduce_after_{name}", t, ref)


# DDP with AdamW, same seeds, ftcomm vs gloo: gradients and parameters after each step
def ddp_run(group, steps=3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))
    ddp = DDP(model, process_group=group)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1000 + RANK)
    grads, params = [], []
    for _ in range(steps):
        x, y = torch.randn(32, 20, generator=g), torch.randint(0, 5, (32,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return grads, params


gf, pf = ddp_run(None)
gg, pg_ = ddp_run(GLOO)
grad_err = max(rel_err(a, b) for sa, sb in zip(gf, gg) for a, b in zip(sa, sb))
param_err = max(rel_err(a, b) for sa, sb in zip(pf, pg_) for a, b in zip(sa, sb))

report(kind="result", rank=RANK, size=N, backend=dist.get_backend(), checks=checks, errors=errors,
       barrier_ok=bool(barrier_ok), unsupported=unsupported, p2p_errors=p2p_errors, bad_input=bad_input,
       grad_err=grad_err, param_err=param_err, pg_type=type(FT).__name__)
dist.destroy_process_group()
