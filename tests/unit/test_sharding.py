"""Unit tests of the training state's pieces that need no MPI job: shard layout, re-shard plans, buddy
placement, replica headers and checksums, the sampler (shard updates: test_stepper.py)."""
import numpy as np
import pytest
import torch

from ftcomm.training.data import ElasticSampler
from ftcomm.training.rebuild import choose_sources
from ftcomm.training.replica import HEADER_BYTES, Replica, ReplicaStore, decode_header, encode_header
from ftcomm.training.buddies import buddies, holders, wards
from ftcomm.training.layout import ShardLayout, reshard_plan
from ftcomm.training import storage


@pytest.mark.parametrize("numel,size", [(10, 4), (2410, 3), (7, 8), (1, 1), (100, 4)])
def test_layout_covers_every_element_once(numel, size):
    lay = ShardLayout(numel, tuple(range(size)))
    covered = np.concatenate([np.arange(*lay.bounds(i)) for i in range(size)])
    assert covered.tolist() == list(range(numel))
    assert lay.padded == size * lay.shard_len >= numel
    assert lay.shard_len == -(-numel // size)


@pytest.mark.parametrize("numel,old_n,new_n", [(2410, 4, 3), (2410, 4, 2), (10, 4, 3), (5, 8, 3), (1000, 3, 3)])
def test_reshard_plan_moves_every_element_once_to_the_right_owner(numel, old_n, new_n):
    old, new = ShardLayout(numel, tuple(range(old_n))), ShardLayout(numel, tuple(range(new_n)))
    source = {s: s % new_n for s in range(old_n)}
    plan = reshard_plan(old, new, source)
    seen = np.zeros(numel, int)
    for p in plan:
        seen[p.lo:p.hi] += 1
        assert new.bounds(p.dst)[0] <= p.lo < p.hi <= new.bounds(p.dst)[1]
        assert old.bounds(p.old_shard)[0] <= p.lo and p.hi <= old.bounds(p.old_shard)[1]
        assert p.src == source[p.old_shard]
    assert (seen == 1).all()


def test_buddies_are_ring_successors_and_wards_predecessors():
    assert buddies(3, 4, 1) == [0] and wards(0, 4, 1) == [3]
    assert buddies(1, 4, 2) == [2, 3] and wards(1, 4, 2) == [0, 3]
    assert buddies(0, 2, 5) == [1]  # k capped at size - 1
    assert holders(2, 4, 2) == [2, 3, 0]
    for r in range(5):
        for b in buddies(r, 5, 2):
            assert r in wards(b, 5, 2)


def test_choose_sources_finds_lost_shards_exactly():
    lay = ShardLayout(400, (10, 11, 12, 13))
    src, lost = choose_sources(lay, alive_world={10, 13}, replicas=1)
    assert lost == [1] and src == {0: 0, 2: 3, 3: 3}  # shard 1 and its buddy 2 are gone
    src, lost = choose_sources(lay, alive_world={10, 13}, replicas=2)
    assert lost == [] and src == {0: 0, 1: 3, 2: 3, 3: 3}
    src, lost = choose_sources(lay, alive_world={10, 11, 13}, replicas=2, bad={(2, 3)})
    assert src[2] == 0 and not lost  # a corrupted replica at rank 3 -> next buddy, rank 0


def test_header_roundtrip_and_checksum_detects_a_flipped_bit():
    state = np.arange(30, dtype=np.float32).reshape(3, 10)
    header = encode_header({"shard": 2, "step": 7, "extra": {"sampler": {"epoch": 1, "cursor": 64}}}, state)
    assert header.shape == (HEADER_BYTES,) and header.dtype == np.uint8
    meta = decode_header(header)
    assert meta["extra"]["sampler"]["cursor"] == 64 and meta["nbytes"] == 120
    rep = Replica(header, state.copy())
    assert rep.is_valid(2, 7) and not rep.is_valid(2, 6) and not rep.is_valid(1, 7)
    rep.state.view(np.uint32)[1, 3] ^= 1  # one bit
    assert not rep.is_valid(2, 7)
    with pytest.raises(ValueError):
        encode_header({"blob": "x" * HEADER_BYTES}, state)


def test_store_double_buffer_keeps_committed_until_commit():
    store = ReplicaStore(1)
    a = store._buffer((2, 4))
    a.state[:] = 1
    store.pending[0] = a
    store.commit()
    b = store._buffer((2, 4))
    b.state[:] = 2
    store.pending[0] = b
    assert store.get(0).state[0, 0] == 1  # pending does not replace committed
    store.discard_pending()
    assert store.get(0).state[0, 0] == 1
    assert store.nbytes == 2 * (HEADER_BYTES + 32)  # committed + one spare buffer


@pytest.mark.parametrize("numel,size", [(10, 4), (2410, 3), (7, 8), (1, 2), (100, 4), (10_000_019, 4), (5, 1)])
def test_buffers_have_room_for_the_layout_of_one_rank_fewer(numel, size):
    now = ShardLayout(numel, tuple(range(size)))
    after = ShardLayout(numel, tuple(range(max(size - 1, 1))))
    assert storage.grown_len(now.shard_len, size) >= after.shard_len
    assert storage.shard_capacity(now, 3) >= 3 * after.shard_len
    assert storage.flat_capacity(now) >= max(after.padded, now.padded)


def test_reuse_views_the_same_memory_when_it_fits_and_refuses_otherwise():
    a = storage.allocate((2, 4), capacity=12)
    assert a.shape == (2, 4) and not a.any() and storage.storage(a).size == 12
    a[:] = 7
    grown = storage.reuse(a, (3, 4))  # a shrink made the shard longer: same memory
    assert grown.shape == (3, 4) and np.shares_memory(grown, a) and grown.flags.c_contiguous
    assert storage.reuse(a, (4, 4)) is None and storage.reuse(None, (1,)) is None
    assert storage.reuse(np.zeros(16, np.float64), (2,)) is None  # float32 memory only
    fresh = storage.reuse_or_allocate(a, (5, 4), capacity=30)
    assert not np.shares_memory(fresh, a) and storage.storage(fresh).size == 30


def test_store_recycles_a_buffer_for_the_larger_shards_after_a_shrink():
    store = ReplicaStore(1)
    a = store._buffer((2, 4), capacity=12)
    store.pending[0] = a
    store.commit()
    store.commit()  # a's buffer is free again
    b = store._buffer((2, 6))
    assert np.shares_memory(b.state, a.state) and b.header is a.header
    c = store._buffer((2, 7))  # larger than any free buffer: a new one
    assert not np.shares_memory(c.state, a.state) and c.state.shape == (2, 7)


def test_sampler_resplit_after_shrink_uses_every_sample_once_per_epoch():
    s = ElasticSampler(103, 16, seed=4)
    used, size = [], 4
    for step in range(s.steps_per_epoch):
        if step == 3:
            size = 3  # a rank died: the survivors re-split what is left of the epoch
        parts = [s.local_indices(r, size) for r in range(size)]
        assert sum(len(p) for p in parts) == len(s.global_batch())
        used += [i for p in parts for i in p.tolist()]
        s.load_state_dict(s.position_after_step())
    assert sorted(used) == list(range(103)) and s.epoch == 1 and s.cursor == 0
    state = s.state_dict()
    t = ElasticSampler(103, 16, seed=4)
    t.load_state_dict(state)
    assert (t.global_batch() == s.global_batch()).all()
