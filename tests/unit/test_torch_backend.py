"""One-process checks of ftcomm.torch: registration, env defaults, a size-1 group's collectives and
Work objects, unsupported ops, the sample re-split arithmetic and the voided-step optimizer hook."""
import datetime
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ftcomm.torch as ft  # noqa: E402
from ftcomm.torch.loop import resplit  # noqa: E402
from ftcomm.torch.group.step_state import STATE, install_hook  # noqa: E402
from ftcomm.torch.group.work import FtWork, make_future  # noqa: E402


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("ftcomm")
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_backend_registered_and_env_defaults():
    assert "ftcomm" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["ftcomm"] == ["cpu", "cuda"]
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        assert os.environ.get(key), key
    assert 0 < int(os.environ["MASTER_PORT"]) < 65536


def test_rendezvous_port_is_free_and_below_the_ephemeral_range():
    from ftcomm.torch.group import rendezvous

    ports = {rendezvous.free_port("127.0.0.1") for _ in range(5)}
    assert all(1024 <= p < rendezvous._ephemeral_start() and rendezvous._bindable("127.0.0.1", p) for p in ports)
    assert len(ports) > 1  # random: jobs started together pick different ones


def test_group_identity(group):
    assert isinstance(group, ft.ProcessGroupFtcomm)
    assert dist.get_backend() == "ftcomm"
    assert (group.rank(), group.size(), dist.get_world_size()) == (0, 1, 1)
    assert group.generation == 0


def test_size_one_collectives(group):
    t = torch.arange(6, dtype=torch.float32)
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    assert isinstance(work, FtWork)
    assert work.wait() is True and work.is_completed() and work.is_success() and work.exception() is None
    assert work.get_future().value()[0] is t
    assert torch.equal(t, torch.arange(6.0))
    out = torch.empty(6)
    dist.all_gather_into_tensor(out, t)
    assert torch.equal(out, t)
    rs = torch.empty(6)
    dist.reduce_scatter_tensor(rs, t * 2)
    assert torch.equal(rs, t * 2)
    b = torch.tensor([True, False])
    dist.broadcast(b, src=0)
    assert b.tolist() == [True, False]
    dist.barrier()


def test_tensor_on_an_unsupported_device_names_it(group):
    with pytest.raises(NotImplementedError, match="on meta tensors"):
        dist.all_reduce(torch.ones(2, device="meta"))


def test_a_sparse_tensor_is_summed_and_refused_elsewhere_by_name(group):
    sparse = torch.eye(3).to_sparse()
    dist.all_reduce(sparse)
    assert torch.equal(sparse.to_dense(), torch.eye(3))
    with pytest.raises(NotImplementedError, match=r"allreduce of sparse tensors takes one CPU tensor and SUM .*op max"):
        dist.all_reduce(sparse, op=dist.ReduceOp.MAX)
    with pytest.raises(NotImplementedError, match=r"broadcast of sparse tensors \(torch.sparse_coo\) is not supported"):
        dist.broadcast(sparse, 0)


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
def test_unsupported_reduce_op_names_it(group, op):
    with pytest.raises(NotImplementedError, match=op):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=getattr(dist.ReduceOp, op))


def test_size_one_rooted_and_all_to_all(group):
    t = torch.arange(4, dtype=torch.float64)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.arange(4.0, dtype=torch.float64))
    out = [torch.empty(2, 2, dtype=torch.int32)]
    dist.gather(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), out, dst=0)
    assert out[0].tolist() == [[1, 2], [3, 4]]
    got = torch.empty(3)
    dist.scatter(got, [torch.tensor([5.0, 6.0, 7.0])], src=0)
    assert got.tolist() == [5.0, 6.0, 7.0]
    a2a = torch.empty(3, 2)
    dist.all_to_all_single(a2a, torch.arange(6.0).view(3, 2))
    assert torch.equal(a2a, torch.arange(6.0).view(3, 2))
    outs = [torch.empty(5, dtype=torch.int64)]
    dist.all_to_all(outs, [torch.arange(5)])
    assert outs[0].tolist() == [0, 1, 2, 3, 4]


def test_all_to_all_splits_that_do_not_add_up_name_the_rank_and_value(group):
    with pytest.raises(ValueError, match=r"world rank 0 gives split sizes that add up to 5"):
        dist.all_to_all_single(torch.empty(4), torch.ones(4), output_split_sizes=[4], input_split_sizes=[5])
    with pytest.raises(ValueError, match=r"world rank 0 gives 2 split sizes for a group of 1"):
        dist.all_to_all_single(torch.empty(4), torch.ones(4), output_split_sizes=[4], input_split_sizes=[2, 2])


def test_monitored_barrier_of_one_rank_returns_and_a_bad_timeout_is_named(group):
    # dist.monitored_barrier itself refuses ftcomm's group: by name (torch 2.13), for registering no
    # CPU backend with torch's C++ group (2.15)
    with pytest.raises(ValueError, match="only implemented for GLOO|requires a group with a CPU-capable backend"):
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=5))
    ft.monitored_barrier(timeout=datetime.timedelta(seconds=5))
    with pytest.raises(ValueError, match=r"monitored_barrier timeout -1 on world rank 0 is not a duration of 0 or more"):
        ft.monitored_barrier(timeout=-1)


@pytest.mark.parametrize("call,text", [
    # the group's own methods: torch refuses a send to oneself before they are reached
    (lambda: dist.group.WORLD.send([torch.ones(2)], 0, 0), r"send peer 0 is not another rank of the group \(0..0"),
    (lambda: dist.group.WORLD.recv([torch.ones(2)], 3, 0), r"recv peer 3 is not another rank"),
    (lambda: dist.group.WORLD.recv_anysource([torch.ones(2)], 7000), r"recv_anysource tag 7000 is not an int in \[0, 7000\)"),
])
def test_point_to_point_refuses_a_bad_peer_or_tag_by_name(group, call, text):
    with pytest.raises(ValueError, match=text):
        call()


def test_bad_dtype_fails_through_work(group):
    work = dist.all_reduce(torch.ones(3, dtype=torch.uint8), async_op=True)
    with pytest.raises(ValueError):  # ftcomm.InvalidInputError is a ValueError
        work.wait()
    assert work.is_completed() and not work.is_success() and work.exception() is not None


def test_work_reports_future_exception():
    fut = make_future()
    work = FtWork(fut, "allreduce")
    assert not work.is_completed()
    fut.set_exception(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        work.wait()


def test_carry_on_keeps_each_ranks_tail_at_the_same_size():
    # 10 samples over 4 ranks: the sampler pads with samples 0 and 1 (each used twice).
    plan = [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    # a spare took a place: the same ranks, each goes on with its own list, padding included
    assert resplit.carry_on(plan, 1, 4) == [[4, 8], [5, 9], [6, 0], [7, 1]]
    # a shrink: what no rank used yet (0 and 1 were), dealt over 3
    assert resplit.carry_on(plan, 1, 3) == resplit.deal([4, 5, 6, 7, 8, 9], 3) == [[4, 7], [5, 8], [6, 9]]


def test_a_pass_read_to_its_end_leaves_nothing_to_carry_on():
    # 289 samples over 3 ranks: lists of 97, 96, 96, cut into 12 batches of 8, the first rank's
    # last one of 9. After the 12th step nothing is left, though 12 * 8 = 96 < 97.
    plan = resplit.deal(list(range(289)), 3)
    steps = resplit.steps_for(plan, 8)
    assert steps == 12 and len(resplit.batches(plan[0], 8, steps)[-1]) == 9
    read = resplit.entries_read(steps, steps, 8, max(len(lst) for lst in plan))
    assert read == 97 and resplit.carry_on(plan, read, 2) == [[], []]
    # before the last step: full batches, and the rest carries on, every sample once
    read = resplit.entries_read(11, steps, 8, 97)
    assert read == 88 and sorted(sum(resplit.carry_on(plan, read, 2), [])) == sorted(
        i for lst in plan for i in lst[88:])


def test_a_drop_last_loader_resumed_at_the_same_size_reads_the_batches_it_would_have_read():
    # 385 samples over 4 ranks (97 each) in batches of 8 with drop_last: 12 batches, 1 left out.
    # Carried on after 5 steps, every rank reads its 7 remaining batches of 8 and leaves out the same
    # one (the last batch taking what is left would have made it 9).
    from torch.utils.data import DataLoader, DistributedSampler

    data = list(range(385))
    sampler = DistributedSampler(data, num_replicas=4, rank=0, shuffle=True, seed=3)
    plan = resplit.sampler_plan(sampler, 4)
    steps = resplit.steps_for(plan, 8, drop_last=True)
    carried = resplit.carry_on(plan, resplit.entries_read(5, steps, 8, 97), 4)
    later = resplit.steps_for(carried, 8, drop_last=True)
    for rank in range(4):
        sampler.rank = rank
        whole = [b.tolist() for b in DataLoader(data, batch_size=8, sampler=sampler, drop_last=True)]
        assert len(whole) == steps == 12
        assert resplit.batches(carried[rank], 8, later, drop_last=True) == whole[5:]


def test_remaining_and_deal():
    plan = [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    rest = resplit.remaining(plan, 1)
    assert rest == [4, 5, 6, 7, 8, 9, 10, 11]
    assert resplit.deal(rest, 3) == [[4, 7, 10], [5, 8, 11], [6, 9]]  # each once: no padding
    assert resplit.deal(rest, 3, drop_last=True) == [[4, 7], [5, 8], [6, 9]]
    assert resplit.deal([4], 3) == [[4], [4], [4]]  # fewer samples than ranks: every rank needs one
    # padding repeats of already used indices are not used again
    assert resplit.remaining([[0, 2], [1, 0]], 1) == [2]


@pytest.mark.parametrize("remaining,ranks,batch", [(161, 3, 32), (160, 3, 32), (96, 3, 32), (7, 3, 4), (2, 3, 8)])
def test_resplit_batches_every_sample_once_in_equal_step_counts(remaining, ranks, batch):
    """After a shrink the rest of the epoch is dealt without padding; every rank runs the same
    number of steps and every remaining sample is in exactly one batch (fewer samples than ranks
    is the one case that repeats some, since a step needs every rank)."""
    plan = resplit.deal(list(range(remaining)), ranks)
    steps = resplit.steps_for(plan, batch)
    per_rank = [resplit.batches(lst, batch, steps) for lst in plan]
    assert all(len(b) == steps for b in per_rank)
    assert all(0 < len(x) <= batch + 1 for b in per_rank for x in b)
    used = sorted(i for b in per_rank for x in b for i in x)
    if remaining >= ranks:
        assert used == list(range(remaining))
    else:
        assert sorted(set(used)) == list(range(remaining)) and len(used) == ranks


def test_sampler_plan_and_reconfigure():
    from torch.utils.data.distributed import DistributedSampler

    data = list(range(10))
    sampler = DistributedSampler(data, num_replicas=4, rank=1, shuffle=True, seed=5)
    sampler.set_epoch(2)
    plan = resplit.sampler_plan(sampler, 4)
    assert sampler.rank == 1 and plan[1] == list(sampler)
    assert [len(lst) for lst in plan] == [3, 3, 3, 3]
    assert {i for lst in plan for i in lst} == set(data)
    resplit.reconfigure_sampler(sampler, rank=0, num_replicas=3)
    fresh = DistributedSampler(data, num_replicas=3, rank=0, shuffle=True, seed=5)
    fresh.set_epoch(2)
    assert (sampler.num_samples, sampler.total_size, list(sampler)) == (fresh.num_samples, fresh.total_size, list(fresh))


def test_poisoned_step_leaves_adamw_untouched():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    model(torch.ones(4, 3)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    install_hook()
    with STATE.lock:
        STATE.guards += 1
        STATE.poisoned, STATE.skipped = True, False
    try:
        opt.step()
        assert STATE.skipped
    finally:
        with STATE.lock:
            STATE.guards -= 1
            STATE.poisoned = STATE.skipped = False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert len(opt.state) == 0  # no moments, no step count
    model(torch.ones(4, 3)).sum().backward()
    opt.step()  # no guard: a normal step
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_resilient_needs_ftcomm_group(group):
    other = dist.new_group(backend="gloo")
    with pytest.raises(TypeError, match="ftcomm process group"):
        iter(ft.resilient([1, 2], process_group=other)).__next__()


def test_resilient_over_batches_without_a_batch_size(group):
    """A DataLoader of whole batches (``batch_size=None``) trains: no disk or memory tier asks for
    its position in samples."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 4, 3), torch.randn(5, 4, 1)
    loop = ft.resilient(DataLoader(TensorDataset(x, y), batch_size=None), model=model, optimizer=opt)
    for xb, yb in loop:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    assert loop.steps_applied == 5 and loop.steps_redone == 0
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for xb, yb in zip(x, y):
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(xb), yb).backward()
        ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
