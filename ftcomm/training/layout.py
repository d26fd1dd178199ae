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

from ..membership.nodes import nodes_of


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
        """Node name of each shard's owner, from the node registry (``ftcomm.membership.nodes``);
        None when some owner's node is unknown (buddies are then plain ring successors)."""
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
        for shard, lo, hi in overlaps(old, new.bounds(dst)):
            if shard not in source:
                raise ValueError(f"old shard {shard} has no source")
            pieces.append(Piece(source[shard], dst, shard, lo, hi))
    return pieces


def overlaps(old: ShardLayout, bounds: tuple[int, int]):
    """The old shards that hold part of the flat range ``bounds`` = [lo, hi), as (old shard, lo,
    hi) triples in flat-vector indices, in shard order; empty intersections are left out."""
    nlo, nhi = bounds
    for shard in range(old.size):
        olo, ohi = old.bounds(shard)
        lo, hi = max(nlo, olo), min(nhi, ohi)
        if lo < hi:
            yield shard, lo, hi
