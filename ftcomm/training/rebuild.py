"""Rebuilding the sharded state after a shrink: find, verify, re-shard, re-replicate, agree.

Every survivor computes the same decisions from the same inputs (the old layout and the new
communicator's world ranks), so the only communication is the re-shard traffic itself plus a
few agreements. Newcomers (spares or respawned processes promoted by ``recover(policy=...)``)
hold nothing: one broadcast from the lowest surviving rank tells them the old layout, step and
metadata, they receive their shard like any other re-shard destination, and the buddy that held
the replaced rank's replica sends them its header (that rank's data position and RNG). Until the
final agreement nothing the survivors held is modified: a failure during the rebuild leaves the
old holdings intact, and the caller simply recovers and rebuilds again (recovery from a failure
during recovery).

The optimizer's side of this is its public interface: ``layout``, ``live``, ``store``,
``step_id``, ``committed_meta``, ``old_state_summary()``, ``replica_meta()`` and ``adopt()``.
"""
from __future__ import annotations

import json
import time

import numpy as np

from ..core import fault
from ..core.codes import Tag
from ..core.outcome import agreed
from ..errors import FtError, InvalidInputError, StateLostError
from .buddies import holders
from .layout import Piece, ShardLayout, reshard_plan
from . import storage
from .replica import HEADER_BYTES, decode_header, encode_header

_BITS = 31  # an agreement carries a non-negative int below 2**31


def choose_sources(old: ShardLayout, alive_world: set, replicas: int, bad=frozenset()) -> tuple[dict, list]:
    """For each old shard with real elements, the old rank to copy it from: its owner if alive,
    else its nearest living buddy, skipping (shard, holder) pairs in ``bad``.

    Returns:
        (sources: old shard -> old rank, lost: old shards without any candidate).
    """
    sources, lost = {}, []
    for shard in range(old.size):
        lo, hi = old.bounds(shard)
        if lo == hi:
            continue  # padding only: nothing to restore
        cands = [h for h in holders(shard, old.size, replicas, old.nodes)
                 if old.world_ranks[h] in alive_world and (shard, h) not in bad]
        if cands:
            sources[shard] = cands[0]
        else:
            lost.append(shard)
    return sources, lost


def agree_bits(comm, good: set, count: int, timeout) -> set:
    """Items 0..count-1 that every rank calls good (bitwise AND over agreements of 31 bits)."""
    agreed = set()
    for base in range(0, count, _BITS):
        flag = sum(1 << b for b in range(_BITS) if base + b in good or base + b >= count)
        value = comm.agree(flag, timeout=timeout)
        agreed |= {base + b for b in range(_BITS) if value >> b & 1 and base + b < count}
    return agreed


def _old_rank(old: ShardLayout, world_rank: int) -> int:
    """This process's rank in the old layout, -1 for a newcomer."""
    return old.world_ranks.index(world_rank) if world_rank in old.world_ranks else -1


def share_old_state(opt, comm) -> tuple[ShardLayout, int, dict]:
    """(old layout, committed step, committed metadata) on every rank of ``comm``. Survivors have
    them; if ``comm`` has newcomers (``opt.layout`` None there), the lowest surviving rank
    broadcasts them (length, then JSON). One min/max round tells everyone whether that is needed,
    and one agreement makes the outcome uniform (the min/max round's outcome is local).

    Raises:
        ProcFailedError etc.: a failure during the exchange (uniform, by an agreement).
        StateLostError: no rank of ``comm`` holds any state.
        InvalidInputError: a newcomer's optimizer differs from the survivors' (class, replicas).
    """
    has = opt.layout is not None
    shared = None
    with agreed(comm, "rebuild: newcomers learning the old layout", step=opt.step_id, timeout=opt.timeout,
                keep=(StateLostError,)):
        mins, _ = comm.minmax([int(has), comm.rank if has else 2**31 - 1], timeout=opt.timeout)
        needed, root = not mins[0], mins[1]
        if needed and root == 2**31 - 1:  # the same on every rank: raised without the agreement
            raise StateLostError("rebuild: no rank of the communicator holds any state", lost_shards=[],
                                 step=-1, failed_ranks=[])
        if needed:
            shared = _broadcast_json(comm, root, opt.old_state_summary() if comm.rank == root else None,
                                     opt.timeout)
    if has:
        return opt.layout, opt.step_id, opt.committed_meta
    if shared["optimizer"] != opt.stepper.name or shared["replicas"] != opt.replicas:
        raise InvalidInputError(f"newcomer built a {opt.stepper.name} optimizer with {opt.replicas} replica(s), "
                                f"the survivors run {shared['optimizer']} with {shared['replicas']}")
    opt.scalars = shared["scalars"]  # the committed step's; the newcomer holds nothing else yet
    return ShardLayout(int(shared["numel"]), tuple(shared["world_ranks"])), int(shared["step"]), shared["meta"]


def _broadcast_json(comm, root: int, value, timeout):
    """``value`` (JSON-serialisable, given on ``root``) on every rank."""
    data = json.dumps(value).encode() if comm.rank == root else None
    return json.loads(comm.broadcast_bytes(data, root, timeout=timeout))


def verified_sources(opt, comm, old: ShardLayout, step: int) -> dict:
    """Chooses a source per old shard and checks each copy used (a replica's header step, shard and
    checksum; an owner's live shard against the checksum it replicated) by an agreement; a bad copy
    makes the next buddy the source.

    Raises:
        StateLostError: some shard has no valid copy left (the same on every survivor).
    """
    alive = set(comm.world_ranks)
    me_old = _old_rank(old, comm.world_rank)
    bad = set()
    while True:
        sources, lost = choose_sources(old, alive, opt.replicas, bad)
        if lost:
            failed = [r for r in range(old.size) if old.world_ranks[r] not in alive]
            raise StateLostError(
                f"shard(s) {lost} of step {step} lost: the owner and all {opt.replicas} buddies failed "
                f"(old ranks {failed}, world ranks {[old.world_ranks[r] for r in failed]})",
                lost_shards=lost, step=step, failed_ranks=failed)
        # Copies this rank serves: replicas against their headers, its own live shard against
        # the checksum its buddies received (a flip in the owner's memory since then: a buddy's
        # replica is used instead).
        mine = {s for s, h in sources.items() if h == me_old}
        good = {s for s in range(old.size) if s not in mine or (s == me_old and opt.live_is_valid())
                or s != me_old and opt.store.get(s) is not None and opt.store.get(s).is_valid(s, step)}
        agreed_good = agree_bits(comm, good, old.size, opt.timeout)
        newly_bad = {(s, sources[s]) for s in sources if s not in agreed_good}
        if not newly_bad:
            return sources
        bad |= newly_bad


def _holding(opt, comm, shard: int) -> np.ndarray:
    """This rank's copy of old ``shard``: its live state or a committed replica."""
    me_old = _old_rank(opt.layout, comm.world_rank)
    return opt.live if shard == me_old else opt.store.get(shard).state


def move_pieces(opt, comm, plan: list[Piece], old: ShardLayout, new: ShardLayout, fill,
                headers=(), holding=None) -> int:
    """Runs the re-shard plan: one ``exchange`` with every piece this rank sends or receives, per
    slot, plus ``headers`` ((src, dst, send array, receive array) for newcomers); pieces within
    this rank are copied. ``fill`` is the new shard array (slots, shard_len); ``holding(shard)``
    gives this rank's copy of an old shard it sends (default: its live shard or a replica).

    Returns:
        Bytes this rank received.
    """
    me = comm.rank
    holding = holding or (lambda shard: _holding(opt, comm, shard))
    sends, recvs, received = [], [], 0
    for p in plan:
        if me not in (p.src, p.dst):
            continue
        src_off = p.lo - old.start(p.old_shard)
        dst_off = p.lo - new.start(p.dst)
        for slot in range(fill.shape[0]):
            dst_view = fill[slot, dst_off:dst_off + p.numel]
            if p.src == me:
                src_view = holding(p.old_shard)[slot, src_off:src_off + p.numel]
                if p.dst == me:
                    dst_view[:] = src_view
                else:
                    sends.append((p.dst, src_view))
            else:
                recvs.append((p.src, dst_view))
                received += dst_view.nbytes
    for src, dst, out, into in headers:
        if src == me:
            sends.append((dst, out))
        if dst == me:
            recvs.append((src, into))
    comm.exchange(sends=sends, recvs=recvs, tag=Tag.RESHARD, timeout=opt.timeout)
    return received


def newcomer_headers(opt, comm, old: ShardLayout, sources: dict, into: np.ndarray) -> list:
    """Header transfers for newcomers: the k-th newcomer (in new rank order) gets the header of
    the replica of the k-th lost old shard (in old rank order), from the buddy chosen as that
    shard's source: the replaced rank's committed metadata (data position, RNG). With spares,
    which fill the lowest failed ranks first and keep ranks, that is exactly the rank each
    newcomer replaced; in any case no two ranks end up with the same RNG stream."""
    alive, new_rank = set(comm.world_ranks), {w: r for r, w in enumerate(comm.world_ranks)}
    lost = [o for o in range(old.size) if old.world_ranks[o] not in alive and o in sources]
    newcomers = [d for d, w in enumerate(comm.world_ranks) if w not in old.world_ranks]
    out = []
    for d, o in zip(newcomers, lost):
        src = new_rank[old.world_ranks[sources[o]]]
        replica = opt.store.get(o) if src == comm.rank else None
        out.append((src, d, replica.header if replica is not None else None, into))
    return out


def plan_bytes(plan: list[Piece], slots: int) -> int:
    """Bytes the whole job moves between ranks for ``plan`` (float32, all slots)."""
    return sum(4 * slots * p.numel for p in plan if p.src != p.dst)


def finish(opt, comm, new: ShardLayout, live: np.ndarray, step: int, meta: dict, ok: bool = True,
           phases: dict | None = None, on_node=None) -> int:
    """Allgathers the parameters, replicates the new shards, agrees; on success adopts the new
    state (``opt.adopt``) and returns the bytes this rank sent to its buddies, else raises
    ProcFailedError with the old holdings untouched. ``ok`` False: this rank's earlier part
    (moving the pieces) already failed. ``on_node``: the replicas the buddies' nodes already
    hold (a relaunch: ``ReplicaStore.replicate``).

    The parameters are gathered into the model's own flat buffer when it is large enough (no
    fresh memory to touch, see ``storage.py``): like the step's allgather, an aborted rebuild
    may leave them half-written, and the next rebuild writes them whole.

    Raises:
        ProcFailedError: on every rank, when any rank's part failed.
    """
    flat = storage.reuse_or_allocate(getattr(opt, "flat", None), (new.padded,), storage.flat_capacity(new),
                                     opt.host_zeros)
    with agreed(comm, f"rebuild of step {step}", step=step, timeout=opt.timeout, catch=(FtError, FileNotFoundError),
                on_abort=opt.store.discard_pending) as outcome:
        if not ok:
            outcome.fail()
        else:
            t0 = time.perf_counter()
            comm.allgather(live[0], flat, timeout=opt.timeout)
            t1 = time.perf_counter()
            header = encode_header(opt.replica_meta(step, meta, comm, new), live)
            sent = opt.store.replicate(comm, header, live, flat, opt.timeout, on_node)
            if phases is not None:
                phases.update(allgather_s=t1 - t0, replicate_s=time.perf_counter() - t1)
    opt.adopt(comm, new, live, flat, step, meta, header)
    return sent


def new_live(opt, new: ShardLayout) -> np.ndarray:
    """The array a rebuild fills with this rank's new shard: the staging shard's memory, which
    holds nothing between steps (no longer marked committed, if it is a segment), else new."""
    staging = getattr(opt, "staging", None)
    if staging is not None and opt.memory is not None:
        opt.memory.unmark(staging)
    return storage.reuse_or_allocate(staging, opt.shard_shape(new), opt.shard_capacity(new), opt.shard_zeros,
                                     opt.shard_reserve)


def rebuild_in_memory(opt, comm) -> dict:
    """ShardedOptimizer.rebuild's body (see there); on a newcomer, its first state."""
    phases, t0 = {}, time.perf_counter()
    old, step, meta = share_old_state(opt, comm)
    t1 = time.perf_counter()
    sources = verified_sources(opt, comm, old, step)
    t2 = time.perf_counter()
    new = ShardLayout(old.numel, tuple(comm.world_ranks))
    new_rank = {w: r for r, w in enumerate(comm.world_ranks)}
    plan = reshard_plan(old, new, {s: new_rank[old.world_ranks[h]] for s, h in sources.items()})
    # The staging shard holds nothing between steps: the new shard goes into its memory.
    live = new_live(opt, new)
    lo, hi = new.bounds(comm.rank)
    live[:, hi - lo:] = 0  # padding; the pieces fill the rest
    header = np.zeros(HEADER_BYTES, np.uint8)
    headers = newcomer_headers(opt, comm, old, sources, header)
    ok = True
    try:
        fault.point("rebuild", comm.world_rank, step)
        move_pieces(opt, comm, plan, old, new, live, headers)
    except FtError:
        ok = False  # agreed on, with the rest of the rebuild, by finish()
    t3 = time.perf_counter()
    me_old = _old_rank(old, comm.world_rank)
    if me_old < 0 and any(dst == comm.rank for _, dst, _, _ in headers):
        meta = (decode_header(header) or {}).get("extra", meta)  # the replaced rank's own metadata
    finish(opt, comm, new, live, step, meta, ok, phases)
    phases.update(share_s=t1 - t0, verify_s=t2 - t1, move_s=t3 - t2, finish_s=time.perf_counter() - t3)
    return {"bytes_moved": plan_bytes(plan, live.shape[0]), "sources": sources, "phases": phases,
            "from_replica": sorted(s for s, h in sources.items() if h != s),
            "old_size": old.size, "new_size": new.size, "old_rank": me_old,
            "newcomers": sorted(r for r, w in enumerate(comm.world_ranks) if w not in old.world_ranks)}
