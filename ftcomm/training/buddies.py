"""Buddy placement: which ranks keep a replica of which shard.

Without node names a shard's buddies are its owner's ``k`` ring successors (Fenix-style buddy
checkpointing, Gamell et al. SC'14). With node names (``ftcomm.membership.nodes``) they are on
other nodes than the owner, so that losing a whole node never takes a shard and all its replicas.
Pure functions: every rank computes the same placement from the same inputs.
"""
from __future__ import annotations


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
