"""Scrubbing the sharded state for silent corruption at rest: a bit flipped in an owner's live
shard or in a replica between two steps.

Every copy already has a checksum to be held against: a replica's header carries the XXH3-64 of
the shard as its owner sent it, and the owner keeps that same value for its live shard
(``ReplicaStore.own_digest``). A check needs no data to cross the network: each rank hashes its
live shard and its replicas (one read pass over k+1 shards), and one agreement over 2N bits
(rank r's live shard intact, rank r's replicas intact) gives every rank the same picture.

A corrupted live shard would otherwise be updated and re-replicated with a fresh, valid checksum:
the flip would become the committed state everywhere. A corrupted replica would be found only
when a failure needs it, by the rebuild's own check, one copy short. So on any bad copy every
rank runs the rebuild on the same communicator: it takes each shard from an intact copy (the
owner's live shard is checked like a replica, so a buddy's replica replaces a corrupted one) and
re-replicates everything, which replaces the bad replicas. Which copy is right needs no vote:
the checksum taken when the step committed decides.
"""
from __future__ import annotations

from ..core import fault
from ..core.events import CorruptionEvent, record_corruption
from .rebuild import agree_bits

CHECKED = "shard and replica checksums (XXH3-64)"


def check_state(opt) -> CorruptionEvent | None:
    """``ShardedOptimizer.check_state`` (see there)."""
    comm, step, n = opt.comm, opt.step_id, opt.comm.size
    _inject_flips(opt, comm.world_rank, step)
    good = set(range(2 * n))
    if not opt.live_is_valid():
        good.discard(comm.rank)
    if any(not replica.is_valid(shard, step) for shard, replica in opt.store.committed.items()):
        good.discard(n + comm.rank)
    intact = agree_bits(comm, good, 2 * n, opt.timeout)
    owners = [comm.world_ranks[r] for r in range(n) if r not in intact]
    holders = [comm.world_ranks[r] for r in range(n) if n + r not in intact]
    if not owners and not holders:
        return None
    opt.rebuild(comm)
    what = "; ".join(filter(None, [owners and f"live shard of world rank(s) {owners}",
                                   holders and f"replica(s) held by world rank(s) {holders}"]))
    return record_corruption(CorruptionEvent(step, sorted(set(owners + holders)), "optimizer state at rest", CHECKED,
                                             f"rebuilt from intact copies ({what})"))


def _inject_flips(opt, world_rank: int, step: int) -> None:
    """Tests: a flip in this rank's live shard (point ``shard``) or in its first replica
    (point ``replica``), as memory corruption since the step committed."""
    fault.flip("shard", world_rank, step, opt.live)
    first = next(iter(opt.store.committed.values()), None)
    if first is not None:
        fault.flip("replica", world_rank, step, first.state)
