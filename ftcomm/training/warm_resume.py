"""A relaunched job resumes from the committed shards its nodes still hold in shared memory.

After ``ftcomm-run --restarts`` relaunched a dead job, every rank of the new job (``launch`` =
FTCOMM_RESTART > 0) does, collectively:

1. **list**: the committed copies (owners' shards and buddies' replicas) that earlier launches
   left in its node's segment directory (``node_memory.scan``); the ranks of a node share its
   directory, so each copy is read by one of them (round robin), which checks its XXH3-64;
2. **agree**: every rank learns what every rank holds (one allgather of a small table), and all
   pick, by the same rule, the newest step for which every shard of its layout is held by some
   rank (the lowest such rank is the shard's source). A step with a shard held nowhere is
   skipped, and that shard is named in the log;
3. **re-shard**: the copies are cut into the new world size's shards and moved, each rank
   receiving only what it lacks (``rebuild.move_pieces``); a piece whose old shard has a copy
   on the receiver's own node is copied from that segment, not sent (``read_on_the_node``),
   plus one header per rank: the
   committed metadata (data position, RNG) of the old rank with its world rank, else of rank 0;
4. **commit**: the parameters are allgathered, the new shards replicated and one agreement
   adopts them (``rebuild.finish``), as after an in-memory recovery; a buddy whose node holds
   copies of every old shard its ward's new shard is cut from copies the replica from them
   (``NodeReplicas``), so only its header is sent. Then each node's lowest rank removes the
   earlier launches' segments.

Nothing is found, or no step is complete: ``resume`` returns None and the caller goes to disk.
A failure during any phase raises on every rank (ProcFailedError, by the phases' agreements)
with the segments untouched: recover the communicator and call ``resume`` again.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time

import numpy as np

from .. import settings
from ..core import fault
from ..core.outcome import agreed
from ..errors import FtError
from ..membership import nodes
from . import node_memory, rebuild
from .layout import ShardLayout, overlaps, reshard_plan
from .replica import HEADER_BYTES, decode_header


def allgather_json(comm, value, timeout) -> list:
    """``value`` (JSON-serialisable) of every rank, in rank order."""
    raw = json.dumps(value, separators=(",", ":")).encode()
    _, longest = comm.minmax([len(raw)], timeout=timeout)
    send = np.zeros(longest[0], np.uint8)
    send[: len(raw)] = np.frombuffer(raw, np.uint8)
    table = np.zeros((comm.size, longest[0]), np.uint8)
    comm.allgather(send, table, timeout=timeout)
    return [json.loads(bytes(row).rstrip(b"\0")) for row in table]


def node_ranks(comm, table: dict) -> list:
    """The ranks of ``comm`` on this rank's node, in order (``table``: {world rank: node})."""
    here = table[comm.world_rank]
    return [r for r, w in enumerate(comm.world_ranks) if table[w] == here]


def _local_copies(opt, comm, launch: int, table: dict) -> dict:
    """This rank's share of its node's committed copies, checked: {(step, shard): (Copy, state)}.
    ``table``: {world rank: node name}."""
    local = node_ranks(comm, table)
    copies = [c for c in node_memory.scan(opt.memory.directory, launch) if _mine(c, opt)]
    held = {}
    for copy in copies[local.index(comm.rank)::len(local)]:
        if (copy.step, copy.shard) in held:
            continue
        state = copy.state()
        if state is not None:
            held[(copy.step, copy.shard)] = (copy, state)
    return held


def _entry(copy) -> list:
    meta = copy.meta
    return [copy.step, copy.shard, meta["size"], meta["numel"], meta["slots"], meta["optimizer"],
            meta.get("world_rank", -1), meta.get("scalars"), copy.path]


def _mine(copy, opt) -> bool:
    """Whether a copy belongs to this optimizer (of the process's several, the same one)."""
    return copy.meta.get("engine", 0) == opt.memory.engine


def choose(everything: list, numel: int, slots: int, optimizer: str, eligible=None) -> tuple:
    """The newest step whose every shard some rank holds (the same on every rank).

    Args:
        everything: per rank, its entries [step, shard, size, numel, slots, optimizer,
            old world rank, scalars, path].
        eligible: the steps that may be chosen (None: any); the caller's own state must exist
            for them too (the torch loop's position, say).

    Returns:
        (step, old layout, {shard: new rank}, {shard: old world rank}, scalars, missing), with
        step None when no step is complete; ``missing``: {step: first shard held nowhere}.
    """
    by_step: dict = {}
    for rank, entries in enumerate(everything):
        for step, shard, size, n, s, name, world_rank, scalars, _ in entries:
            if (n, s, name) != (numel, slots, optimizer):
                continue  # a copy of another model or optimizer
            held = by_step.setdefault((step, size), {})
            if shard not in held or rank < held[shard][0]:
                held[shard] = (rank, world_rank, scalars)
    missing = {}
    for step, size in sorted(by_step, reverse=True):
        if eligible is not None and step not in eligible:
            continue
        held = by_step[(step, size)]
        old = ShardLayout(numel, tuple(range(size)))
        needed = [s for s in range(size) if old.bounds(s)[0] < old.bounds(s)[1]]
        absent = [s for s in needed if s not in held]
        if absent:
            missing[step] = absent[0]
            continue
        sources = {s: held[s][0] for s in needed}
        owners = {s: held[s][1] for s in held}
        return step, old, sources, owners, held[needed[0]][2], missing
    return None, None, {}, {}, None, missing


def resume(opt, comm, log=None, eligible=None, fetch=None) -> dict | None:
    """Loads the newest step every shard of which is held in the nodes' shared memory (see the
    module docstring); collective.

    Args:
        opt: a ``ShardedOptimizer`` built by this launch (its state is replaced).
        comm: its communicator.
        log: ``log(**event)`` (``events.py``); events "warm_resume_incomplete" (a step skipped,
            the shard missing) and, from the caller, "resumed".
        eligible: the steps the caller can resume at (None: any; see ``choose``).
        fetch: ``fetch(step)``, collective, run once the step is chosen and before any state
            changes (a failure in it leaves everything as it was): the caller's own state of that
            step, returned as "fetched".

    Returns:
        None when this is not a relaunch, there is no node memory, or no step is complete; else
        {"step", "from_world_size", "bytes_read" (this rank's copies), "bytes_moved" (whole job),
        "bytes_replicated" (this rank's sends to its buddies: headers only where their nodes held
        the copies),
        "phases": {"list_s", "agree_s", "move_s", "finish_s" and, within the finish,
        "allgather_s", "replicate_s"}}.

    Raises:
        ProcFailedError etc.: a failure during the resume, on every rank; nothing changed.
    """
    launch = settings.restart_count()
    if opt.memory is None or launch == 0:
        return None
    t0 = time.perf_counter()
    opt.phase = "warm resume"  # what a failure meanwhile is logged as having interrupted
    with agreed(comm, "warm resume: listing the nodes' segments", timeout=opt.timeout):
        table = nodes.gather(comm, opt.timeout)
        held = _local_copies(opt, comm, launch, table)
        everything = allgather_json(comm, [_entry(c) for c, _ in held.values()], opt.timeout)
    t1 = time.perf_counter()
    step, old, sources, owners, scalars, missing = choose(everything, opt.numel, len(opt.stepper.slots),
                                                          opt.stepper.name, eligible)
    for skipped, shard in sorted(missing.items(), reverse=True):
        if step is None or skipped > step:
            (log or (lambda **e: None))(event="warm_resume_incomplete", step=skipped, missing_shard=shard)
    if missing and comm.rank == 0 and (step is None or max(missing) > step):
        newest = max(missing)
        print(f"ftcomm: the nodes' memory holds no whole copy of shard {missing[newest]} of step {newest} "
              f"(lost with its node, or damaged)" + ("" if step is None else f": resuming from step {step}")
              + ("" if step is not None else ": none of its steps is whole, the disk checkpoint (if any) takes over"),
              file=sys.stderr, flush=True)
    if step is None:
        remove_earlier(opt.memory, comm, launch, table)  # nothing whole: the disk takes over, they are stale
        opt.phase = None
        return None
    fetched = fetch(step) if fetch is not None else None
    new = ShardLayout(old.numel, tuple(comm.world_ranks))
    node = [table[w] for w in comm.world_ranks]
    where = copies_on_nodes(everything, node, (step, old.size, opt.numel, len(opt.stepper.slots), opt.stepper.name))
    plan, paths = read_on_the_node(reshard_plan(old, new, sources), where, node, comm)
    here = {shard: path for (shard, at), path in where.items() if at == node[comm.rank]}  # paths and more
    on_node = NodeReplicas(old, new, where, node, holding=lambda shard: _holding(held, here, step, shard))
    live = rebuild.new_live(opt, new)
    lo, hi = new.bounds(comm.rank)
    live[:, hi - lo:] = 0
    header = np.zeros(HEADER_BYTES, np.uint8)
    headers = _metadata_transfers(comm, held, step, sources, owners, header)  # from other ranks

    ok = True
    t2 = time.perf_counter()
    try:
        fault.point("warm_resume", comm.world_rank, step)
        rebuild.move_pieces(opt, comm, plan, old, new, live, headers,
                            holding=lambda shard: _holding(held, paths, step, shard))
    except (FtError, FileNotFoundError):
        ok = False  # agreed on by finish()
    t3 = time.perf_counter()
    decoded = decode_header(header)
    if decoded is None or not isinstance(decoded.get("extra", {}), dict):
        ok = False  # a damaged header: the resume fails everywhere (finish agrees) and is tried again
    meta = (decoded or {}).get("extra", {})
    opt.scalars = scalars
    finish_phases = {}
    replicated = rebuild.finish(opt, comm, new, live, step, meta, ok, finish_phases, on_node)
    t4 = time.perf_counter()
    remove_earlier(opt.memory, comm, launch, table)
    opt.phase = None
    return {"step": step, "from_world_size": old.size, "fetched": fetched, "bytes_read": sum(s.nbytes for _, s in held.values()),
            "bytes_moved": rebuild.plan_bytes(plan, live.shape[0]), "bytes_replicated": replicated,
            "phases": {"list_s": t1 - t0, "agree_s": t2 - t1, "move_s": t3 - t2, "finish_s": t4 - t3, **finish_phases}}


def report(log, step: int, comm, found: dict) -> None:
    """Logs "resumed" (``"from": "memory"``, at the caller's ``step``) with the figures of
    ``found`` (``resume``'s result and the caller's "load_s", the whole resume's seconds) and says
    it on stderr (rank 0 of ``comm``): the account both training loops give of a warm resume."""
    log(event="resumed", step=step, **{"from": "memory"}, world_size=comm.size,
        from_world_size=found["from_world_size"], bytes_read=found["bytes_read"], bytes_moved=found["bytes_moved"],
        bytes_replicated=found["bytes_replicated"],
        load_s=round(found["load_s"], 6), **{k: round(v, 6) for k, v in found["phases"].items()})
    if comm.rank == 0:
        print(f"ftcomm: resumed from the nodes' shared memory (step {step}, written by {found['from_world_size']} "
              f"ranks) at world size {comm.size} in {found['load_s']:.2f} s", file=sys.stderr, flush=True)


def copies_on_nodes(everything: list, node: list, chosen: tuple) -> dict:
    """{(old shard, node): the path of a copy of it there} for the chosen step: ``chosen`` =
    (step, old size, numel, slots, optimizer); ``node``: the node of each rank of the
    communicator. The same on every rank (same inputs)."""
    where = {}
    for rank, entries in enumerate(everything):
        for step, shard, size, numel, slots, name, _, _, path in entries:
            if (step, size, numel, slots, name) == chosen:
                where.setdefault((shard, node[rank]), path)
    return where


def read_on_the_node(plan: list, where: dict, node: list, comm) -> tuple[list, dict]:
    """The re-shard plan with each piece whose old shard has a copy on its receiver's node taken
    from that copy directly (src = dst: a copy within the node's shared memory instead of a
    message), and the paths of the copies this rank reads so ({old shard: path}). The same plan
    on every rank (same inputs). ``where``: ``copies_on_nodes``; ``node``: the node of each
    rank."""
    out, paths = [], {}
    for piece in plan:
        path = where.get((piece.old_shard, node[piece.dst]))
        if piece.src != piece.dst and path is not None:
            piece = dataclasses.replace(piece, src=piece.dst)
            if piece.dst == comm.rank:
                paths[piece.old_shard] = path
        out.append(piece)
    return out, paths


class NodeReplicas:
    """The replicas of the new shards that their buddies' nodes already hold: after a relaunch,
    each old shard a ward's new shard is cut from may still have a copy (its owner's shard or a
    replica) on the buddy's node. Such a replica is copied from those segments, within the node,
    instead of being sent (``ReplicaStore.replicate``'s ``on_node``): the relaunch writes the
    replicas without moving them between ranks.

    Args:
        old, new: the layouts of the chosen step and of this launch.
        where: ``copies_on_nodes``; node: the node of each rank of the communicator.
        holding: ``holding(old shard)``: this rank's checked copy ``(slots, shard_len)`` of an
            old shard that its node holds.
    """

    def __init__(self, old: ShardLayout, new: ShardLayout, where: dict, node: list, holding):
        self.old, self.new, self.where, self.node, self.holding = old, new, where, node, holding

    def holds(self, ward: int, buddy: int) -> bool:
        """Whether every old shard that ``ward``'s new shard is cut from has a copy on
        ``buddy``'s node (the same answer on every rank)."""
        return all((shard, self.node[buddy]) in self.where
                   for shard, _, _ in overlaps(self.old, self.new.bounds(ward)))

    def fill(self, ward: int, state: np.ndarray) -> None:
        """Copies ``ward``'s optimizer slots (all but slot 0, the parameters) into ``state``
        ``(slots, new shard_len)`` from this node's copies, the padding zeroed.

        Raises:
            FileNotFoundError: a copy is gone or damaged since it was listed."""
        start, (lo, hi) = self.new.start(ward), self.new.bounds(ward)
        for shard, a, b in overlaps(self.old, (lo, hi)):
            offset = self.old.start(shard)
            state[1:, a - start:b - start] = self.holding(shard)[1:, a - offset:b - offset]
        state[1:, hi - start:] = 0


def _holding(held: dict, paths: dict, step: int, shard: int) -> np.ndarray:
    """This rank's copy of old shard ``shard`` of ``step``: one it checked itself, else the one
    another rank of its node checked (mapped again, checked again).

    Raises:
        FileNotFoundError: that copy is gone or damaged since (the resume fails everywhere and is
            tried again)."""
    if (step, shard) in held:
        return held[(step, shard)][1]
    found = node_memory.found_at(paths[shard])
    state = found.state() if isinstance(found, node_memory.Copy) and found.step == step else None
    if state is None:
        raise FileNotFoundError(f"the copy of shard {shard} of step {step} at {paths[shard]} is gone or damaged")
    held[(step, shard)] = (found, state)
    return state


def _metadata_transfers(comm, held: dict, step: int, sources: dict, owners: dict, into: np.ndarray) -> list:
    """Header transfers (src, dst, send, receive) giving each new rank the committed metadata of
    the old shard whose owner had its world rank, else of shard 0 (as a disk resume does)."""
    by_world = {w: s for s, w in owners.items()}
    out = []
    for rank, world_rank in enumerate(comm.world_ranks):
        shard = by_world.get(world_rank, min(sources))
        src = sources[shard]
        if src != comm.rank:
            out.append((src, rank, None, into))
        elif rank == comm.rank:
            into[:] = held[(step, shard)][0].header()  # this rank holds its own: no transfer
        else:
            out.append((src, rank, held[(step, shard)][0].header(), into))
    return out


def remove_earlier(memory, comm, launch: int, table: dict) -> None:
    """Each node's lowest rank removes the segments earlier launches left there (after the
    agreement that ended the resume: nobody reads them any more). ``memory``: a ``NodeMemory``
    of the job; ``table``: {world rank: node}."""
    if node_ranks(comm, table)[0] == comm.rank:
        node_memory.remove_earlier_launches(memory.directory, launch)
