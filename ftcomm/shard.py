"""Shard layout and re-shard plans for ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC'20).

The flattened fp32 parameters (and every optimizer-state tensor of the same length) are cut into
``size`` contiguous shards of equal length ``shard_len = ceil(numel / size)``; the last shard is
padded with zeros so that every rank holds, sends and receives the same number of elements (the
point-to-point layer then needs no size negotiation). Rank ``i`` owns elements
``[i * shard_len, min((i + 1) * shard_len, numel))``.

Pure functions and plain data: no MPI here, so the arithmetic is unit-tested on one process.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardLayout:
    """Which elements of a flat vector of ``numel`` elements each shard owns.

    Attributes:
        numel: elements of the flat vector (parameters; padding excluded).
        world_ranks: MPI_COMM_WORLD rank of the owner of each shard; shard id = index here =
            the owner's rank in the communicator the layout was made for.
    """

    numel: int
    world_ranks: tuple

    @property
    def size(self) -> int:
        """Number of shards (the world size of the layout's communicator)."""
        return len(self.world_ranks)

    @property
    def shard_len(self) -> int:
        """Elements per shard, padding included (at least 1)."""
        return max(1, -(-self.numel // self.size))

    @property
    def padded(self) -> int:
        """Length of the padded flat vector: ``size * shard_len``."""
        return self.size * self.shard_len

    def bounds(self, shard: int) -> tuple[int, int]:
        """[lo, hi) of the real (unpadded) elements of ``shard``, in flat-vector indices; empty
        (lo == hi) for a shard made only of padding."""
        lo = min(shard * self.shard_len, self.numel)
        hi = min(lo + self.shard_len, self.numel)
        return lo, hi

    def start(self, shard: int) -> int:
        """Flat index of the shard's first element (padding counted)."""
        return shard * self.shard_len

    @property
    def nodes(self) -> tuple | None:
        """Node name of each shard's owner, from the node registry (``register_nodes``); None
        when some owner's node is unknown (buddies are then plain ring successors)."""
        return nodes_of(self.world_ranks)


@dataclass(frozen=True)
class Piece:
    """One contiguous run of elements moving from an old shard to a new shard during re-shard.

    ``src`` and ``dst`` are ranks in the new communicator; ``old_shard`` names the shard of the
    old layout the elements come from; ``lo``/``hi`` are flat-vector indices.
    """

    src: int
    dst: int
    old_shard: int
    lo: int
    hi: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


def reshard_plan(old: ShardLayout, new: ShardLayout, source: dict) -> list[Piece]:
    """The pieces that turn shards of ``old`` into shards of ``new``.

    Args:
        old, new: layouts over the same ``numel``.
        source: old shard id -> new rank that holds a copy of it (the surviving owner or a buddy
            with a replica).

    Returns:
        Pieces sorted by (dst, lo): every real element of every new shard is covered exactly
        once. Every rank computes the same list from the same inputs, so both ends of each
        transfer post their messages in the same order (MPI's non-overtaking rule then matches
        them without extra tags).

    Raises:
        ValueError: the layouts differ in ``numel``, or an old shard with real elements has no
            source.
    """
    if old.numel != new.numel:
        raise ValueError(f"re-shard between layouts of {old.numel} and {new.numel} elements")
    pieces = []
    for dst in range(new.size):
        nlo, nhi = new.bounds(dst)
        for shard in range(old.size):
            olo, ohi = old.bounds(shard)
            lo, hi = max(nlo, olo), min(nhi, ohi)
            if lo >= hi:
                continue
            if shard not in source:
                raise ValueError(f"old shard {shard} has no source")
            pieces.append(Piece(source[shard], dst, shard, lo, hi))
    return pieces


# -- node-aware buddy placement (issue 9) ------------------------------------------------------
# World rank -> node name, the same on every rank (filled by one collective, ``register_nodes``).
_NODE_OF_WORLD: dict = {}


def register_nodes(mapping: dict) -> None:
    """Records the node of each world rank (``{world_rank: node_name}``). Call it with the same
    mapping on every rank (ftcomm.nodes.register(comm) gathers it collectively)."""
    _NODE_OF_WORLD.update({int(w): str(n) for w, n in mapping.items()})


def nodes_of(world_ranks) -> tuple | None:
    """Node of each world rank in ``world_ranks``, or None if any is unknown."""
    try:
        return tuple(_NODE_OF_WORLD[int(w)] for w in world_ranks)
    except KeyError:
        return None


def _node_major(size: int, nodes) -> list[int]:
    """Ranks grouped by node (nodes in order of first appearance), rank order within a node."""
    first = {}
    for r in range(size):
        first.setdefault(nodes[r], r)
    return sorted(range(size), key=lambda r: (first[nodes[r]], r))


def buddies(rank: int, size: int, replicas: int, nodes=None) -> list[int]:
    """Ranks that keep a replica of ``rank``'s shard.

    Without ``nodes``: its ``replicas`` ring successors (Fenix-style buddy placement).

    With ``nodes`` (node name per rank): buddies on other nodes than ``rank``'s, each on a
    different node while there are enough nodes, so that the loss of a whole node never takes a
    shard and all its replicas (as long as ``replicas`` >= 1 and there are >= 2 nodes). Ranks
    are walked in node-major order starting one node-stride (the largest node's rank count)
    after ``rank``, which spreads the replicas evenly when nodes hold equally many ranks
    (2 nodes x 2 ranks, k=1: 0->2, 1->3, 2->0, 3->1). Only when there are too few other nodes
    does a buddy share ``rank``'s node.
    """
    k = min(replicas, size - 1)
    if nodes is None or k <= 0:
        return [(rank + d) % size for d in range(1, k + 1)]
    if len(nodes) != size:
        raise ValueError(f"nodes names {len(nodes)} ranks, the communicator has {size}")
    order = _node_major(size, nodes)
    stride = max(sum(1 for n in nodes if n == m) for m in set(nodes))
    pos = order.index(rank)
    # The d-th choice is d node-strides on (balanced for equal nodes), then everything else.
    cands = [order[(pos + d * stride) % size] for d in range(1, size + 1)]
    cands += [order[(pos + stride + j) % size] for j in range(size)]
    cands = [c for c in dict.fromkeys(cands) if c != rank]
    mine, chosen, used = nodes[rank], [], set()
    for accept in (lambda c: nodes[c] != mine and nodes[c] not in used,  # a new other node
                   lambda c: nodes[c] != mine,                          # any other node
                   lambda c: True):                                     # too few nodes
        for c in cands:
            if len(chosen) == k:
                break
            if c not in chosen and accept(c):
                chosen.append(c)
                used.add(nodes[c])
    return chosen


def holders(shard: int, size: int, replicas: int, nodes=None) -> list[int]:
    """Old ranks that hold a copy of ``shard``, best first: the owner, then its buddies in the
    order ``buddies`` gives."""
    return [shard, *buddies(shard, size, replicas, nodes)]


def wards(rank: int, size: int, replicas: int, nodes=None) -> list[int]:
    """Ranks whose replicas ``rank`` keeps (the inverse of ``buddies``), nearest ring
    predecessor first."""
    if nodes is None:
        return [(rank - d) % size for d in range(1, min(replicas, size - 1) + 1)]
    return [w for w in ((rank - d) % size for d in range(1, size))
            if rank in buddies(w, size, replicas, nodes)]
