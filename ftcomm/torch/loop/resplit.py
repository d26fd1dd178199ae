"""Re-splitting an epoch's remaining samples over the survivors (pure index arithmetic).

An epoch plan is the list of dataset indices each rank reads, in order, one list per rank (what
``DistributedSampler`` gives every rank: lists of one length). After ``consumed`` steps of
``batch_size`` samples were applied, each rank has used the first ``consumed * batch_size``
indices of its list, or all of it once the pass is over (``entries_read``: a last batch may hold
one more); the rest, interleaved in the sampler's global order, is dealt again over
the new number of ranks, each sample exactly once: the new lists may differ in length by one,
and ``batches`` cuts every rank's list into the same number of batches, so that every rank runs
the same number of steps (DDP needs that).
"""
from __future__ import annotations


def sampler_plan(sampler, num_replicas: int) -> list[list[int]]:
    """Every rank's index list for the sampler's current epoch, as ``DistributedSampler`` would give
    it with ``num_replicas`` ranks. The sampler's ``rank`` is restored afterwards."""
    saved = sampler.rank
    try:
        plan = []
        for q in range(num_replicas):
            sampler.rank = q
            plan.append([int(i) for i in iter(sampler)])
        return plan
    finally:
        sampler.rank = saved


def sampler_plan_at(sampler, num_replicas: int) -> list[list[int]]:
    """``sampler_plan`` as a ``DistributedSampler`` over ``num_replicas`` ranks would give it (the
    size that wrote a checkpoint), whatever its own world size; the sampler is left as it was."""
    rank, size = sampler.rank, sampler.num_replicas
    try:
        reconfigure_sampler(sampler, 0, num_replicas)
        return sampler_plan(sampler, num_replicas)
    finally:
        reconfigure_sampler(sampler, rank, size)


def remaining(plan: list[list[int]], used: int) -> list[int]:
    """The indices not yet used when each rank used the first ``used`` entries of its list, in the
    global (interleaved) order, each dataset index once, indices that were already used left out
    (the sampler's padding repeats a few)."""
    done = set()
    for lst in plan:
        done.update(lst[:used])
    out, seen = [], set()
    length = max((len(lst) for lst in plan), default=0)
    for k in range(used, length):
        for lst in plan:
            if k < len(lst):
                idx = lst[k]
                if idx not in done and idx not in seen:
                    seen.add(idx)
                    out.append(idx)
    return out


def carry_on(plan: list[list[int]], used: int, num_replicas: int, drop_last: bool = False) -> list[list[int]]:
    """The plan for the rest of the epoch after each rank of ``plan`` used its first ``used``
    indices. With the same number of ranks (a spare took the failed rank's place) every rank
    keeps the rest of its own list, the sampler's padding included, so the epoch goes on exactly
    as it would have without the failure; with another number the rest is merged in the global
    order and dealt again (``remaining`` + ``deal``)."""
    if len(plan) == num_replicas:
        return [list(lst[used:]) for lst in plan]
    return deal(remaining(plan, used), num_replicas, drop_last)


def deal(indices: list[int], num_replicas: int, drop_last: bool = False) -> list[list[int]]:
    """Splits ``indices`` over ``num_replicas`` ranks round-robin, as ``DistributedSampler`` does,
    but without its padding: every index goes to exactly one rank, and lengths differ by at most
    one. ``drop_last`` cuts the tail to a multiple of ``num_replicas`` instead (as the sampler
    does). Only when there are fewer indices than ranks are some repeated, so that every rank
    has one (a step needs every rank).

    Raises:
        ValueError: ``num_replicas`` < 1.
    """
    if num_replicas < 1:
        raise ValueError("num_replicas must be at least 1")
    n = len(indices)
    if drop_last:
        dealt = indices[: (n // num_replicas) * num_replicas]
    elif 0 < n < num_replicas:
        dealt = (list(indices) * num_replicas)[:num_replicas]
    else:
        dealt = list(indices)
    return [dealt[q::num_replicas] for q in range(num_replicas)]


def batches(indices: list[int], batch_size: int, steps: int, drop_last: bool = False) -> list[list[int]]:
    """``indices`` cut into ``steps`` batches of ``batch_size`` in order, the last one taking what
    is left (possibly one more than ``batch_size``, when this rank's list is one longer than
    another's that fills ``steps`` batches exactly). ``drop_last`` (the DataLoader's): every
    batch holds ``batch_size``, and what is left after ``steps`` of them is not read."""
    if steps <= 0:
        return []
    if drop_last:
        return [indices[k * batch_size:(k + 1) * batch_size] for k in range(steps)]
    out = [indices[k * batch_size:(k + 1) * batch_size] for k in range(steps - 1)]
    out.append(indices[(steps - 1) * batch_size:])
    return out


def steps_for(plan: list[list[int]], batch_size: int, drop_last: bool = False) -> int:
    """Steps every rank runs over ``plan``: as many as the shortest list fills (a partial batch
    counts, unless ``drop_last``)."""
    shortest = min((len(lst) for lst in plan), default=0)
    return shortest // batch_size if drop_last else -(-shortest // batch_size)


def entries_read(steps_done: int, steps: int, batch_size: int, longest: int) -> int:
    """How many entries of its list each rank has read after ``steps_done`` of the ``steps``
    batches its list was cut into: ``steps_done`` full batches before the last step; after it the
    whole list (``longest``: the longest list's length). The last batch takes what is left, which
    on some ranks is one entry more than ``batch_size``; a tail the loader dropped (``drop_last``)
    ends with the pass too."""
    return longest if steps_done >= steps else steps_done * batch_size


def reconfigure_sampler(sampler, rank: int, num_replicas: int) -> None:
    """Points a ``DistributedSampler`` at a new rank and world size, recomputing its per-rank
    length exactly as its constructor does (takes effect from the next ``iter``)."""
    import math

    sampler.rank = rank
    sampler.num_replicas = num_replicas
    n = len(sampler.dataset)
    if sampler.drop_last and n % num_replicas != 0:
        sampler.num_samples = math.ceil((n - num_replicas) / num_replicas)
    else:
        sampler.num_samples = math.ceil(n / num_replicas)
    sampler.total_size = sampler.num_samples * num_replicas
