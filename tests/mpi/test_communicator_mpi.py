"""Failure-free multi-rank tests in the pytest-mpi style:

    ftcomm-run -n 4 python -m pytest --with-mpi tests/mpi

Every test runs on every rank; without --with-mpi they are skipped. Values are checked against
numpy references; results are compared across ranks through an allgather of digests."""
import hashlib
import re

import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(scope="module")
def comm():
    import ftcomm

    return ftcomm.Communicator()


def _same_on_every_rank(comm, array) -> bool:
    digest = np.frombuffer(hashlib.blake2b(array.tobytes(), digest_size=8).digest(), np.int64).copy()
    every = np.zeros(comm.size, np.int64)
    comm.allgather(digest, every)
    return bool(np.all(every == every[0]))


def test_rank_and_size_match_mpi(comm):
    from mpi4py import MPI

    assert comm.size == MPI.COMM_WORLD.Get_size()
    assert comm.rank == MPI.COMM_WORLD.Get_rank()
    assert comm.world_ranks == list(range(comm.size))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_allreduce_matches_numpy(comm, dtype, op):
    n = comm.size
    inputs = [np.random.default_rng([r, 7]).integers(1, 3 if op == "prod" else 9, 1001).astype(dtype)
              for r in range(n)]
    buf = inputs[comm.rank].copy()
    comm.allreduce(buf, op=op, chunk_bytes=512)
    stack = np.stack(inputs).astype(np.float64)
    ref = {"sum": stack.sum(0), "min": stack.min(0), "max": stack.max(0), "prod": stack.prod(0),
           "avg": np.trunc(stack.sum(0) / n) if dtype.startswith("int") else stack.sum(0) / n}[op]
    if op == "avg" and not dtype.startswith("int"):
        np.testing.assert_allclose(buf.astype(np.float64), ref, rtol=2e-3)
    else:
        np.testing.assert_array_equal(buf.astype(np.float64), ref)
    assert _same_on_every_rank(comm, buf)


def test_bucket_of_buffers_is_one_step(comm):
    a = np.full(17, comm.rank + 1, np.float32)
    b = np.full(3, comm.rank + 1, np.int64)
    before = comm.last_committed_step
    step = comm.allreduce([a, b], op="sum")
    total = comm.size * (comm.size + 1) // 2
    assert step == before + 1 == comm.last_committed_step
    np.testing.assert_array_equal(a, np.full(17, total, np.float32))
    np.testing.assert_array_equal(b, np.full(3, total, np.int64))


def test_replay_of_committed_step_is_a_noop(comm):
    buf = np.full(5, comm.rank + 1.0)
    step = comm.allreduce(buf)
    committed = buf.copy()
    comm.allreduce(buf, step=step)  # same step: no communication, buffer kept
    np.testing.assert_array_equal(buf, committed)


def test_bad_input_fails_on_every_rank(comm):
    import ftcomm

    # Only rank 1 passes a read-only buffer; every rank must raise, none may hang.
    buf = np.ones(8, np.float32)
    if comm.rank == 1:
        buf.flags.writeable = False
    with pytest.raises(ftcomm.InvalidInputError, match=r"rank 1 \(world rank 1\) rejected its input: a buffer is "
                                                      r"read-only; .*saw: buffer 0 \(ndarray\) is read-only"):
        comm.allreduce(buf, timeout=20)
    # Lengths that differ between ranks.
    with pytest.raises(ftcomm.InvalidInputError, match="different lengths"):
        comm.allreduce(np.ones(4 + comm.rank, np.float32), timeout=20)
    # A step id that goes backwards, on one rank only.
    step = comm.last_committed_step
    with pytest.raises(ftcomm.InvalidInputError):
        comm.allreduce(np.ones(2), step=step - 1 if comm.rank == 0 else step + 1, timeout=20)
    # Nothing was lost: the communicator still works and the ledger did not move.
    assert comm.last_committed_step == step
    ok = np.ones(3)
    comm.allreduce(ok)
    np.testing.assert_array_equal(ok, np.full(3, float(comm.size)))


def _reference(inputs, op, dtype, n):
    stack = np.stack(inputs).astype(np.float64)
    return {"sum": stack.sum(0), "min": stack.min(0), "max": stack.max(0), "prod": stack.prod(0),
            "avg": np.trunc(stack.sum(0) / n) if dtype.startswith("int") else stack.sum(0) / n}[op]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_reduce_scatter_matches_numpy(comm, dtype, op):
    n, m = comm.size, 301  # 301 elements per segment: several 512-byte chunks and a short one
    inputs = [np.random.default_rng([r, 11]).integers(1, 3 if op == "prod" else 9, n * m).astype(dtype)
              for r in range(n)]
    mine = inputs[comm.rank].copy()
    out = np.full(m, -1, dtype)
    comm.reduce_scatter(mine, out, op=op, chunk_bytes=512)
    ref = _reference(inputs, op, dtype, n)[comm.rank * m:(comm.rank + 1) * m]
    if op == "avg" and not dtype.startswith("int"):
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-3)
    else:
        np.testing.assert_array_equal(out.astype(np.float64), ref)
    np.testing.assert_array_equal(mine, inputs[comm.rank])  # the input is only read


def test_reduce_scatter_output_may_alias_input_and_input_may_be_read_only(comm):
    import torch

    n, m = comm.size, 1000
    inputs = [torch.arange(n * m, dtype=torch.float32) * (r + 1) for r in range(n)]
    buf = inputs[comm.rank].clone()
    view = buf[comm.rank * m:(comm.rank + 1) * m]  # torch's in-place form: output inside input
    comm.reduce_scatter(buf, view, chunk_bytes=1024)
    expected = sum(inputs)[comm.rank * m:(comm.rank + 1) * m]
    assert torch.equal(view, expected)
    frozen = np.arange(n * 4, dtype=np.float64)
    frozen.flags.writeable = False
    out = np.zeros(4)
    comm.reduce_scatter(frozen, out, op="max")
    np.testing.assert_array_equal(out, frozen[comm.rank * 4:(comm.rank + 1) * 4])


def test_reduce_scatter_bad_output_fails_on_every_rank(comm):
    import ftcomm

    n = comm.size
    step = comm.last_committed_step
    src = np.ones(n * 6, np.float32)
    out = np.full(5 if comm.rank == 1 else 6, 7, np.float32)  # rank 1's output is too short
    with pytest.raises(ftcomm.InvalidInputError, match=r"reduce-scatter step .*rank 1 \(world rank 1\) rejected its "
                                                      r"input: the output is not 1/N .*saw: its input has"):
        comm.reduce_scatter(src, out, timeout=20)
    np.testing.assert_array_equal(out, np.full(out.size, 7, np.float32))  # untouched
    with pytest.raises(ftcomm.InvalidInputError, match="different lengths"):
        comm.reduce_scatter(np.ones(n * (2 + comm.rank), np.float32), np.zeros(2 + comm.rank, np.float32), timeout=20)
    assert comm.last_committed_step == step
    good = np.zeros(6, np.float32)
    committed = comm.reduce_scatter(src, good)
    np.testing.assert_array_equal(good, np.full(6, float(n), np.float32))
    good[:] = 0
    comm.reduce_scatter(src, good, step=committed)  # a replay: a no-op
    np.testing.assert_array_equal(good, np.zeros(6, np.float32))


def test_guard_raises_no_false_alarm_in_1000_steps(comm):
    """Transit checksums and result fingerprints on: 1,000 committed steps of random data, sizes
    (odd ones: tails shorter than a checksum word), dtypes and ops (the average sums its scaled
    result separately), chunked into many pieces; none voided, every result equal to numpy's."""
    n = comm.size
    dtypes = ["float32", "float64", "float16", "int32", "int64"]
    for i in range(1000):
        rng = np.random.default_rng([i, 99])
        dtype, count, op = dtypes[i % 5], int(rng.integers(1, 3000)), ("sum", "max", "avg")[i % 3]
        inputs = [np.random.default_rng([i, r]).integers(-50, 50, count).astype(dtype) for r in range(n)]
        buf = inputs[comm.rank].copy()
        comm.allreduce(buf, op=op, chunk_bytes=256, checksums=True, fingerprints=True)
        stacked = np.stack(inputs).astype(np.float64)
        if op == "sum":
            np.testing.assert_array_equal(buf.astype(np.float64), stacked.sum(0))
        elif op == "max":
            np.testing.assert_array_equal(buf.astype(np.float64), stacked.max(0))
        elif dtype.startswith("int"):
            np.testing.assert_array_equal(buf.astype(np.float64), np.trunc(stacked.sum(0) / n))
        else:
            np.testing.assert_allclose(buf.astype(np.float64), stacked.sum(0) / n, rtol=1e-3)


def test_guarded_reduce_scatter_raises_no_false_alarm_in_300_steps(comm):
    """The reduce-scatter with transit checksums: 300 committed steps of random data, block sizes
    (odd ones included), dtypes and ops, chunked into many pieces; none voided, every rank's block
    equal to numpy's."""
    n = comm.size
    dtypes = ["float32", "float64", "float16", "int32", "int64"]
    for i in range(300):
        rng = np.random.default_rng([i, 98])
        dtype, block, op = dtypes[i % 5], int(rng.integers(1, 700)), ("sum", "max", "min")[i % 3]
        inputs = [np.random.default_rng([i, r]).integers(-50, 50, block * n).astype(dtype) for r in range(n)]
        out = np.zeros(block, dtype)
        comm.reduce_scatter(inputs[comm.rank], out, op=op, chunk_bytes=256, checksums=True)
        whole = getattr(np.stack(inputs).astype(np.float64), op)(0)
        np.testing.assert_array_equal(out.astype(np.float64), whole[comm.rank * block:(comm.rank + 1) * block])


def test_two_threads_on_two_communicators_run_guarded_steps_at_once(comm):
    """Each thread keeps its own scratch (undo log, staging): two communicators' steps in two
    threads at once stay right, and no false alarm is raised."""
    import threading

    import ftcomm

    other = ftcomm.Communicator(comm.mpi_comm)
    results = {}

    def work(c, tag):
        good = 0
        for step in range(40):
            x = np.full(100_000, float(c.rank + tag), np.float32)
            c.allreduce(x, checksums=True, chunk_bytes=65536, timeout=60)
            good += bool(np.all(x == float(sum(r + tag for r in range(c.size)))))
        results[tag] = good

    thread = threading.Thread(target=work, args=(other, 2))
    thread.start()
    work(comm, 1)
    thread.join()
    assert results == {1: 40, 2: 40}


def test_agreements_in_two_threads_at_once_are_right(comm):
    """Open MPI's agreement, run by two threads at once on two communicators, returned values no
    rank contributed (through mpi4py alone: up to 7 in 6,000 calls a rank, in 2 of 4 runs);
    ftcomm's MPI calls hold one lock per process, so every result here is the AND of the flags."""
    import threading

    import ftcomm

    other = ftcomm.Communicator(comm.mpi_comm)
    wrong = {}

    def work(c, tag):
        every_bit = 0x7FFF00FF | (tag << 8)  # the two threads' agreements differ in bits 8-15
        flag = every_bit & ~(1 << (c.rank % 8))
        expected = every_bit
        for r in range(c.size):
            expected &= ~(1 << (r % 8))
        wrong[tag] = [i for i in range(2000) if c.agree(flag, timeout=60) != expected]

    thread = threading.Thread(target=work, args=(other, 2))
    thread.start()
    work(comm, 1)
    thread.join()
    assert wrong == {1: [], 2: []}


def test_chunk_bytes_must_agree_across_ranks(comm):
    import ftcomm

    buf = np.ones(1000, np.float32)
    with pytest.raises(ftcomm.InvalidInputError, match="different chunk_bytes"):
        comm.allreduce(buf, chunk_bytes=4096 if comm.rank == 0 else 1024, timeout=20)
    with pytest.raises(ftcomm.InvalidInputError, match=r"its chunk_bytes is not a positive integer.*chunk_bytes -1"):
        comm.allreduce(buf, chunk_bytes=-1 if comm.rank == comm.size - 1 else 4096, timeout=20)
    with pytest.raises(ftcomm.InvalidInputError, match="different chunk_bytes"):
        comm.reduce_scatter(np.ones(comm.size * 300, np.float32), np.zeros(300, np.float32),
                            chunk_bytes=256 * (comm.rank + 1), timeout=20)
    np.testing.assert_array_equal(buf, np.ones(1000, np.float32))


@pytest.mark.parametrize("guard", ["checksums", "fingerprints"])
def test_guard_must_agree_across_ranks(comm, guard):
    import ftcomm

    buf = np.ones(10, np.float32)
    with pytest.raises(ftcomm.InvalidInputError, match=r"corruption guard .*rank 0 \(world rank \d+\): checksums on"):
        comm.allreduce(buf, timeout=20, **{guard: comm.rank == 0})
    np.testing.assert_array_equal(buf, np.ones(10, np.float32))


def test_agree_is_the_and_of_flags(comm):
    flag = 0b1111 & ~(1 << (comm.rank % 4))
    expected = 0b1111
    for r in range(comm.size):
        expected &= ~(1 << (r % 4))
    assert comm.agree(flag) == expected


def test_allgather_and_broadcast(comm):
    out = np.zeros(comm.size * 3, np.int32)
    comm.allgather(np.full(3, comm.rank, np.int32), out)
    np.testing.assert_array_equal(out, np.repeat(np.arange(comm.size, dtype=np.int32), 3))
    buf = np.arange(6.0) if comm.rank == comm.size - 1 else np.zeros(6)
    comm.broadcast(buf, root=comm.size - 1)
    np.testing.assert_array_equal(buf, np.arange(6.0))


def test_broadcast_bytes_of_any_length(comm):
    root = comm.size - 1
    for data in (bytes(range(256)) * 3 + b"tail", b""):  # 772 bytes, then none
        got = comm.broadcast_bytes(data if comm.rank == root else None, root=root)
        assert got == data


def test_barrier_and_timeout_argument_checked(comm):
    comm.barrier(timeout=30)
    with pytest.raises(ValueError):
        comm.barrier(timeout=0)


def _collective(comm, name, x):
    """Calls the collective `name` on the float32 buffer `x` (4 x size elements)."""
    if name == "allreduce":
        comm.allreduce(x, timeout=30)
    elif name == "reduce_scatter":
        comm.reduce_scatter(x, np.zeros(x.size // comm.size, np.float32), timeout=30)
    elif name == "allgather":
        comm.allgather(x[:4], np.zeros(4 * comm.size, np.float32), timeout=30)
    elif name == "broadcast":
        comm.broadcast(x, root=0, timeout=30)
    else:  # a min/max round of 40 values
        comm.minmax(list(range(40)), timeout=30)


@pytest.mark.parametrize("even, odd", [("allreduce", "reduce_scatter"), ("allreduce", "minmax"),
                                       ("allgather", "broadcast"), ("broadcast", "allreduce")])
def test_ranks_in_different_collectives_raise_on_every_rank(comm, even, odd):
    # A program error: even ranks call one collective, odd ranks another. Every rank raises at
    # once (no wait for the timeout), naming a rank in each, and no buffer is touched; no message
    # is left behind, so the communicator's next collectives are right.
    import ftcomm

    n, r = comm.size, comm.rank
    x = np.arange(4 * n, dtype=np.float32) + r
    before = x.copy()
    with pytest.raises(ftcomm.CollectiveMismatchError,
                       match=r"ranks called different collectives: rank \d+ \(world rank \d+\) is in an? .+, "
                             r"rank \d+ \(world rank \d+\) in an? "):
        _collective(comm, even if r % 2 == 0 else odd, x)
    np.testing.assert_array_equal(x, before)
    y = np.arange(6, dtype=np.float64) * (r + 1)
    comm.allreduce(y, timeout=30)
    np.testing.assert_array_equal(y, np.arange(6.0) * n * (n + 1) / 2)
    assert comm.minmax([r, -r], timeout=30) == ([0, -(n - 1)], [n - 1, 0])


def test_minmax_of_different_lengths_raises_on_every_rank(comm):
    import ftcomm

    n, r = comm.size, comm.rank
    with pytest.raises(ftcomm.CollectiveMismatchError,
                       match=r"different numbers of values to a min/max round \(Communicator.minmax\) "
                             r"\(rank \d+ \(world rank \d+\): [23], rank \d+ \(world rank \d+\): [23]\)"):
        comm.minmax([r] * (2 + r % 2), timeout=30)
    assert comm.minmax([r, -r], timeout=30) == ([0, -(n - 1)], [n - 1, 0])


@pytest.mark.parametrize("others", ["next step", "reduce_scatter"])
def test_a_rank_replaying_while_the_others_go_on_raises_on_every_rank(comm, others):
    # Rank 0 replays the committed step while the others take the next one (or call another
    # collective): an error on every rank at once, not a wait for the timeout; nothing moves.
    import ftcomm

    n, r = comm.size, comm.rank
    x = np.arange(4 * n, dtype=np.float32) + r
    committed = comm.allreduce(x, timeout=30)
    before = x.copy()
    expected = ftcomm.CollectiveMismatchError if others == "reduce_scatter" else ftcomm.InvalidInputError
    match = "different collectives" if others == "reduce_scatter" else r"different step ids \(rank 0 \(world rank \d+\)"
    with pytest.raises(expected, match=match):
        if r == 0:
            comm.allreduce(x, step=committed, timeout=30)
        elif others == "next step":
            comm.allreduce(x, timeout=30)
        else:
            comm.reduce_scatter(x, np.zeros(4, np.float32), timeout=30)
    np.testing.assert_array_equal(x, before)
    assert comm.last_committed_step == committed
    assert comm.allreduce(x, step=committed, timeout=30) == committed  # a replay on every rank
    np.testing.assert_array_equal(x, before)


def test_exchange_refuses_ftcomm_own_tags(comm):
    import ftcomm

    for tag in (7000, 7002, -1, 1.5):
        with pytest.raises(ftcomm.InvalidInputError, match=f"tag {tag!r} is not an int in"):
            comm.exchange(sends=[((comm.rank + 1) % comm.size, np.ones(3, np.uint8))], tag=tag)
    got = np.zeros(3, np.uint8)  # the communicator is as before: a user tag works
    comm.exchange(sends=[((comm.rank + 1) % comm.size, np.full(3, comm.rank, np.uint8))],
                  recvs=[((comm.rank - 1) % comm.size, got)], tag=6999, timeout=30)
    np.testing.assert_array_equal(got, np.full(3, (comm.rank - 1) % comm.size, np.uint8))


@pytest.mark.parametrize("bad", [2**63, -2**63, 1.5])
def test_minmax_value_out_of_range_on_one_rank_raises_on_every_rank(comm, bad):
    # Rank 1 passes a value the round cannot carry (-2**63 has no negation in int64, 2**63 and 1.5
    # are no int64): every rank raises, naming it, none waits for its timeout; the round's bounds
    # themselves are carried exactly.
    import ftcomm

    n, r = comm.size, comm.rank
    values = [r, bad if r == 1 else -r, 7]
    here = rf" \(here: value {re.escape(repr(bad))} at index 1\)" if r == 1 else "$"
    with pytest.raises(ftcomm.InvalidInputError,
                       match=r"rank 1 \(world rank \d+\) passed a value outside \(-2\*\*63, 2\*\*63\) "
                             r"to a min/max round \(Communicator.minmax\)" + here):
        comm.minmax(values, timeout=30)
    assert comm.minmax([r, -r, 2**63 - 1, -2**63 + 1], timeout=30) == (
        [0, -(n - 1), 2**63 - 1, -2**63 + 1], [n - 1, 0, 2**63 - 1, -2**63 + 1])


def test_a_python_thread_holding_the_mpi_call_lock_does_not_deadlock_the_bindings(comm):
    """A thread polls a request under ``serialized()`` (it takes the GIL back while holding the
    lock) while this one reads is_revoked and failed_ranks (which take the lock): the bindings
    release the GIL first, so both go on. Without ULFM those verbs take no MPI lock (they answer
    without calling MPI), so there is nothing to test."""
    if not comm.ft_enabled:
        pytest.skip("without ULFM is_revoked and failed_ranks call no MPI and take no lock")
    import threading
    import time

    from mpi4py import MPI

    from ftcomm.core.mpi_calls import serialized

    mpi = comm.mpi_comm
    with serialized():
        request = mpi.Irecv(np.empty(1, np.int64), source=(comm.rank + 1) % comm.size, tag=4242)
    stop, polls = threading.Event(), [0]

    def poll():
        while not stop.is_set():
            with serialized():
                request.Test()
            polls[0] += 1

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    reads, end = 0, time.monotonic() + 1.0
    try:
        while time.monotonic() < end:
            assert comm.is_revoked is False and comm.failed_ranks() == []
            reads += 1
    finally:  # a poller left running would call MPI after MPI_Finalize
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and reads > 100 and polls[0] > 100
    with serialized():
        request.Cancel()
    status = MPI.Status()
    request.Wait(status)
    assert status.Is_cancelled()
