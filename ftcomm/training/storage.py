"""Float32 arrays that keep their memory when a re-shard changes their shape.

After a shrink from N to N-1 ranks every shard grows by N/(N-1). Allocating the new shards,
replicas and flat parameters afresh made the recovery pay for memory touched for the first time:
at 10M parameters on 4 ranks, about 240 MB per rank between the rebuild and the redone step.
Under transparent huge pages a first touch can wait for the kernel to compact memory (measured
on these machines: 0.28 s for the first 160 MB of a process, 0.02 s for the next 160 MB), and it
happened on every survivor at once, at the moment the job was waiting for them.

So every shard-sized buffer is allocated with room for the shards of one rank fewer
(``grown_len``), and a re-shard takes its new arrays out of buffers that are free at that moment
(``reuse``): the staging shard, recycled replica buffers, the flat parameters and gradients. The
first shrink then touches no new memory; a later one allocates again, with room for one more.
Cost: ``(N / (N-1) - 1)`` more memory for those buffers, a third at 4 ranks, 1.6% at 64.

Where the memory comes from is the caller's choice (``zeros``): plain numpy memory by default;
the buffers that a GPU's copies touch are page-locked (``ftcomm/torch/zero/device_shard.py``).
"""
from __future__ import annotations

import math

import numpy as np

_F32 = np.float32


def _plain_zeros(n: int, used: int | None = None) -> np.ndarray:
    return np.zeros(n, _F32)  # pages are taken at their first touch: nothing to reserve


def grown_len(shard_len: int, size: int) -> int:
    """Shard length that holds the shards of any vector now split into ``size`` shards of
    ``shard_len`` once it is split over ``size - 1`` ranks (``shard_len`` when size is 1)."""
    return shard_len if size <= 1 else -(-shard_len * size // (size - 1))


def shard_capacity(layout, slots: int) -> int:
    """Elements to allocate for a ``(slots, shard_len)`` shard buffer of ``layout`` (a
    ``ShardLayout``): room for one shrink."""
    return slots * grown_len(layout.shard_len, layout.size)


def flat_capacity(layout) -> int:
    """Elements to allocate for the flat parameters or gradients of ``layout``: room for the
    padding of one rank fewer."""
    return grown_len(layout.shard_len, layout.size) * max(layout.size - 1, 1)


def allocate(shape: tuple, capacity: int = 0, zeros=None) -> np.ndarray:
    """A zeroed C-contiguous float32 array of ``shape`` over memory of at least ``capacity``
    elements (the rest is room to grow, see ``reuse``). ``zeros(n, used)``, if given, provides
    that memory: a zeroed, C-contiguous 1-D float32 ndarray of ``n`` elements (page-locked, or a
    node-memory segment that reserves the first ``used`` now and the rest when ``reuse``'s
    caller grows into it)."""
    n = math.prod(shape)
    return (zeros or _plain_zeros)(max(n, capacity), n)[:n].reshape(shape)


def storage(array: np.ndarray) -> np.ndarray:
    """The array at the root of ``array``'s views: the one over all of its memory (``array``
    itself if it is not a view of another array; memory mapped from a segment or a buffer is
    such a root)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def reuse(array: np.ndarray | None, shape: tuple) -> np.ndarray | None:
    """A C-contiguous float32 array of ``shape`` over the memory of ``array`` (its contents are
    whatever that memory held), or None when there is no ``array`` or its memory is too small.
    The caller must no longer use ``array`` itself."""
    if array is None:
        return None
    owner = storage(array)
    if not isinstance(owner, np.ndarray) or owner.dtype != _F32 or owner.ndim != 1 \
            or not owner.flags.c_contiguous or owner.size < math.prod(shape):
        return None
    return owner[: math.prod(shape)].reshape(shape)


def reuse_or_allocate(array: np.ndarray | None, shape: tuple, capacity: int, zeros=None, reserve=None) -> np.ndarray:
    """``reuse(array, shape)``, else ``allocate(shape, capacity, zeros)``. ``reserve(view)``, if
    given, takes the memory of a reused view before it is written (``NodeMemory.reserve``); its
    False sends the buffer to ``allocate``."""
    found = reuse(array, shape)
    if found is not None and (reserve is None or reserve(found)):
        return found
    return allocate(shape, capacity, zeros)
