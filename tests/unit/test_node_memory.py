"""Node-local shared memory segments (ftcomm/training/node_memory.py) and the warm resume's choice
of step and sources (ftcomm/training/warm_resume.py): one process, files under tmp_path."""
import os

import numpy as np
import pytest

from ftcomm import segment_paths
from ftcomm.training import node_memory, warm_resume
from ftcomm.training.replica import Replica, checksum, encode_header


def _meta(step, shard, size=2, numel=10, slots=2):
    return {"shard": shard, "step": step, "world_rank": shard, "numel": numel, "shard_len": -(-numel // size),
            "size": size, "slots": slots, "optimizer": "SGD", "scalars": [{"step": float(step)}],
            "extra": {"pos": step}}


def _committed(memory, step, shard, value, size=2, numel=10):
    """A live shard of (2, shard_len) in a segment, marked committed at ``step``."""
    shard_len = -(-numel // size)
    state = memory.zeros(2 * shard_len)[: 2 * shard_len].reshape(2, shard_len)
    state[:] = value
    memory.mark(state, step, encode_header(_meta(step, shard, size, numel), state))
    return state


@pytest.fixture
def memory(tmp_path, monkeypatch):
    monkeypatch.setenv("FTCOMM_SHM_DIR", str(tmp_path))
    directory = segment_paths.node_dir("n1", key="job-a")
    return node_memory.NodeMemory(directory, world_rank=0, launch=0)


def test_a_committed_segment_is_listed_by_a_later_launch_and_read_back(memory):
    state = _committed(memory, 5, 0, 1.5)
    assert node_memory.scan(memory.directory, before_launch=0) == []  # its own launch's: not listed
    (copy,) = node_memory.scan(memory.directory, before_launch=1)
    assert (copy.step, copy.shard, copy.meta["extra"]) == (5, 0, {"pos": 5})
    assert np.array_equal(copy.state(), state) and copy.meta["xxh3"] == checksum(state)
    assert os.stat(copy.path).st_mode & 0o777 == 0o600 and os.stat(memory.directory).st_mode & 0o777 == 0o700


def test_a_half_written_or_damaged_segment_is_not_used(memory):
    state = _committed(memory, 5, 0, 1.5)
    memory.unmark(state)  # the next step writes it
    assert node_memory.scan(memory.directory, before_launch=1) == []
    memory.mark(state, 5)
    (copy,) = node_memory.scan(memory.directory, before_launch=1)
    state[1, 2] = 7.0  # a flipped value after the mark: the checksum no longer matches
    assert copy.state() is None


def test_a_replica_lives_in_one_segment_and_its_commit_marks_it(memory):
    replica = memory.replica_buffer((2, 5), capacity=12)
    replica.state[:] = 3.0
    replica.header[:] = encode_header(_meta(4, 1), replica.state)
    assert node_memory.scan(memory.directory, before_launch=1) == []  # pending: not committed yet
    memory.mark(replica.state, 4, replica.header)
    (copy,) = node_memory.scan(memory.directory, before_launch=1)
    assert copy.shard == 1 and np.array_equal(copy.state(), np.full((2, 5), 3.0, np.float32))
    assert isinstance(replica, Replica)


def test_two_optimizers_of_one_process_have_segments_of_their_own(memory):
    second = node_memory.NodeMemory(memory.directory, world_rank=0, launch=0)  # the process's next optimizer
    _committed(memory, 5, 0, 1.0)
    _committed(second, 5, 0, 2.0)
    assert second.engine == memory.engine + 1
    names = sorted(os.listdir(memory.directory))
    assert len(names) == 2 and {n.split("-")[2] for n in names} == {f"E{memory.engine}", f"E{second.engine}"}


def test_other_jobs_segments_are_never_listed_nor_removed(memory, tmp_path):
    _committed(memory, 5, 0, 1.0)
    other = node_memory.NodeMemory(segment_paths.node_dir("n1", key="job-b"), world_rank=0, launch=0)
    _committed(other, 9, 0, 2.0)
    assert [c.step for c in node_memory.scan(memory.directory, 1)] == [5]
    segment_paths.remove_job(key="job-a")
    assert not os.path.exists(memory.directory)
    assert [c.step for c in node_memory.scan(other.directory, 1)] == [9]


def test_close_removes_only_this_process_segments(memory):
    _committed(memory, 5, 0, 1.0)
    neighbour = node_memory.NodeMemory(memory.directory, world_rank=1, launch=0)
    _committed(neighbour, 5, 1, 2.0)
    memory.close()
    assert [c.shard for c in node_memory.scan(memory.directory, 1)] == [1]
    assert node_memory.remove_earlier_launches(memory.directory, 1) == 1
    assert os.listdir(memory.directory) == []


def _entry(step, shard, size=4, numel=100, world_rank=None, path=None):
    return [step, shard, size, numel, 3, "AdamW", shard if world_rank is None else world_rank, [{"step": step}],
            path or f"/shm/{step}-{shard}.seg"]


def test_the_newest_step_held_whole_is_chosen_with_the_lowest_holder_as_source():
    everything = [
        [_entry(7, 0), _entry(7, 2), _entry(6, 0), _entry(6, 2)],   # new rank 0
        [_entry(7, 1), _entry(6, 1), _entry(6, 3), _entry(7, 0)],   # new rank 1: shard 3 of step 7 is gone
    ]
    step, old, sources, owners, scalars, missing = warm_resume.choose(everything, 100, 3, "AdamW")
    assert step == 6 and old.size == 4 and missing == {7: 3}
    assert sources == {0: 0, 1: 1, 2: 0, 3: 1} and scalars == [{"step": 6}] and owners[3] == 3


def test_copies_of_another_model_do_not_count_and_nothing_whole_is_none():
    everything = [[_entry(7, 0), _entry(7, 1, numel=99)], [_entry(7, 2), _entry(7, 3)]]
    step, _, _, _, _, missing = warm_resume.choose(everything, 100, 3, "AdamW")
    assert step is None and missing == {7: 1}
    assert warm_resume.choose([[], []], 100, 3, "AdamW")[0] is None


def test_pieces_whose_old_shard_has_a_copy_on_the_receivers_node_are_read_there():
    """4 old shards at 2 new ranks on one node (n1) and a third on n2, which holds nothing: n1's
    ranks read every piece they need from the node's memory, n2's rank receives messages."""
    from types import SimpleNamespace

    from ftcomm.training.layout import ShardLayout, reshard_plan

    everything = [[_entry(7, 0), _entry(7, 2)], [_entry(7, 1), _entry(7, 3)], []]
    step, old, sources, *_ = warm_resume.choose(everything, 100, 3, "AdamW")
    new = ShardLayout(100, (10, 11, 12))
    plan = reshard_plan(old, new, sources)
    assert any(p.src != p.dst and p.dst in (0, 1) for p in plan)  # without it: messages within n1
    node = ["n1", "n1", "n2"]
    where = warm_resume.copies_on_nodes(everything, node, (step, 4, 100, 3, "AdamW"))
    assert where == {(s, "n1"): f"/shm/7-{s}.seg" for s in range(4)}
    for rank in range(3):
        comm = SimpleNamespace(world_ranks=[10, 11, 12], rank=rank)
        local, paths = warm_resume.read_on_the_node(plan, where, node, comm)
        assert [(p.old_shard, p.dst, p.lo, p.hi) for p in local] == [(p.old_shard, p.dst, p.lo, p.hi) for p in plan]
        assert all(p.src == p.dst for p in local if p.dst in (0, 1))
        assert [(p.src, p.dst) for p in local if p.dst == 2] == [(p.src, p.dst) for p in plan if p.dst == 2]
        read = {p.old_shard for p in plan if p.dst == rank and p.src != rank} if rank < 2 else set()
        assert paths == {s: f"/shm/7-{s}.seg" for s in read}


def test_a_replica_whose_node_holds_every_old_shard_is_copied_there_bitwise():
    """4 old shards of 10 elements (3 slots), re-sharded over 3 new ranks: ranks 0 and 1 on n1,
    which holds copies of old shards 0-3, rank 2 on n2, which holds shard 3 only. A new shard's
    replica is copied on its buddy's node only when that node holds every old shard it is cut
    from, and then equals the new shard itself (numpy reference: the flat state, cut anew)."""
    from ftcomm.training.layout import ShardLayout

    old, new = ShardLayout(10, (0, 1, 2, 3)), ShardLayout(10, (10, 11, 12))
    flat = np.arange(3 * 12, dtype=np.float32).reshape(3, 12)[:, :10] + 0.5  # every slot, 10 elements
    copies = {s: np.ascontiguousarray(np.pad(flat[:, slice(*old.bounds(s))],
                                             ((0, 0), (0, old.shard_len - (old.bounds(s)[1] - old.bounds(s)[0])))))
              for s in range(4)}
    where = {**{(s, "n1"): f"/shm/{s}.seg" for s in range(4)}, (3, "n2"): "/shm/n2-3.seg"}
    replicas = warm_resume.NodeReplicas(old, new, where, ["n1", "n1", "n2"], holding=copies.__getitem__)
    # new shard 2 is cut from old shards 2 and 3 only on n1; new shard 0 needs shards 0, 1: not on n2
    assert [replicas.holds(ward, 2) for ward in range(3)] == [False, False, False]
    assert [replicas.holds(ward, 0) for ward in range(3)] == [True, True, True]
    for ward in range(3):
        lo, hi = new.bounds(ward)
        state = np.full((3, new.shard_len), -1.0, np.float32)  # a recycled buffer: stale values
        state[0] = 7.0  # the parameter slot comes from the allgather, not from here
        replicas.fill(ward, state)
        assert np.array_equal(state[1:, : hi - lo], flat[1:, lo:hi])
        assert not state[1:, hi - lo:].any() and (state[0] == 7.0).all()


def test_blobs_take_turns_so_the_previous_step_stays_whole(memory):
    memory.put_blob("loop", 3, b"three")
    memory.put_blob("loop", 4, b"four" * 2000)  # larger than the first segment's room: a new one
    found = {b.step: b for b in node_memory.scan_blobs(memory.directory, 1, "loop", memory.engine)}
    assert sorted(found) == [3, 4] and found[3].read() == b"three" and found[4].read() == b"four" * 2000
    memory.put_blob("loop", 5, b"five")  # overwrites step 3's turn
    found = {b.step: b for b in node_memory.scan_blobs(memory.directory, 1, "loop", memory.engine)}
    assert sorted(found) == [4, 5] and found[5].read() == b"five"
    assert node_memory.scan_blobs(memory.directory, 1, "loop", memory.engine + 1) == []  # another optimizer's
    assert node_memory.scan(memory.directory, 1) == []  # blobs are not shard copies


def test_a_full_tmpfs_sends_new_buffers_to_private_memory_and_says_so(memory, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node_memory, "_Segment", full)
    zeros = memory.zeros(100)
    replica = memory.replica_buffer((2, 10), capacity=30)
    memory.put_blob("loop", 1, b"x")
    assert zeros.shape == (100,) and not zeros.any() and replica.state.shape == (2, 10)
    memory.mark(zeros, 3)  # not a segment: nothing to mark, no error
    assert os.listdir(memory.directory) == []
    err = capsys.readouterr().err
    assert err.count("cannot hold") == 1 and "No space left on device" in err and "FTCOMM_WARM=0" in err


def test_a_segment_reserves_the_memory_it_uses_and_the_rest_when_a_buffer_grows_into_it(memory, monkeypatch, capsys):
    """A buffer with room to grow after a shrink (``storage.allocate``'s capacity) reserves only
    the tmpfs memory it uses; ``reuse_or_allocate`` reserves the rest when it grows into it, and
    goes to private memory, saying so, when the tmpfs cannot hold it."""
    from ftcomm.training import storage

    def reserved(array):  # pages the file system holds for the array's segment file
        (path,) = [s.path for s in memory._segments.values() if s.data.ctypes.data == storage.storage(array).ctypes.data]
        return os.stat(path).st_blocks * 512 // node_memory.PAGE

    def pages(array):  # the pages of the segment's head and of the array
        return -(-(node_memory.DATA_OFFSET + array.nbytes) // node_memory.PAGE)

    small = storage.allocate((2, 50_000), 2 * 100_000, memory.zeros)  # room for twice the shard
    assert reserved(small) == pages(small)
    grown = storage.reuse_or_allocate(small, (2, 80_000), 0, memory.zeros, memory.reserve)
    assert grown.ctypes.data == small.ctypes.data and reserved(grown) == pages(grown)
    grown[:] = 1.0  # its pages are reserved: no SIGBUS whatever the tmpfs holds

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node_memory.os, "posix_fallocate", full)
    private = storage.reuse_or_allocate(grown, (2, 100_000), 0, memory.zeros, memory.reserve)
    assert private.shape == (2, 100_000) and not private.any() and memory._segment_of(private) is None
    assert capsys.readouterr().err.count("cannot hold") == 1


def test_a_damaged_header_or_a_truncated_file_is_not_used(memory):
    state = _committed(memory, 5, 0, 1.5)
    (copy,) = node_memory.scan(memory.directory, 1)
    with open(copy.path, "r+b") as f:  # "cursor"-like damage: one bit of the header's JSON
        f.seek(node_memory.HEADER_OFFSET + 3)
        byte = f.read(1)
        f.seek(node_memory.HEADER_OFFSET + 3)
        f.write(bytes([byte[0] ^ 0x01]))
    assert node_memory.scan(memory.directory, 1) == []
    memory.mark(state, 5, encode_header(_meta(5, 0), state))  # whole again
    (copy,) = node_memory.scan(memory.directory, 1)
    os.truncate(copy.path, node_memory.DATA_OFFSET + 8)
    assert copy.state() is None
