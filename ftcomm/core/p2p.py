"""Small collectives built on ``Communicator.exchange``: a ring allgather and a binomial-tree
broadcast, each with a uniform input check first. They move bytes of host buffers, so any dtype
goes. Their outcome after the input check is local (``exchange``'s): callers that need every rank
to agree follow them with ``agree`` (``ftcomm.core.outcome``).
"""
from __future__ import annotations

import zlib

import numpy as np

from ..errors import InvalidInputError
from . import buffers
from .codes import RoundKind, Tag

# Problem codes of the uniform input check (the highest code any rank reports is named).
_NOT_A_BUFFER, _RECV_SIZE, _DTYPE_DIFFERS, _BAD_ROOT = 1, 2, 3, 4
_PROBLEMS = {
    _NOT_A_BUFFER: "a buffer is not a contiguous (writable) numpy array or CPU tensor",
    _RECV_SIZE: "recvbuf does not hold size x sendbuf bytes",
    _DTYPE_DIFFERS: "sendbuf and recvbuf dtypes differ",
    _BAD_ROOT: "root is not a rank of the communicator",
}


_ROUND_KINDS = {"allgather": RoundKind.ALLGATHER, "broadcast": RoundKind.BROADCAST}


# A rank rides in the low bits of a second copy of each field, so that the min and the max also
# say who passed them (values clamped below 2**43 there: 8 TiB of bytes).
_RANK_SLOTS, _PACKABLE = 1 << 20, 1 << 43


def validate(comm, what: str, problem: int, fields, names, timeout) -> None:
    """Uniform input check of a collective: every rank brings its own problem code (0 = none)
    and the values that must be equal everywhere; one min/max round (of the collective's own
    kind, ``what``: "allgather" or "broadcast") gives every rank the same view, hence the same
    InvalidInputError (or none). The error names the world ranks."""
    fields = [int(f) for f in fields]
    packed = [min(max(f, 0), _PACKABLE - 1) * _RANK_SLOTS + comm.rank for f in fields]
    values = [problem, comm.rank if problem else -1, *fields, *packed]
    mins, maxs = comm.minmax(values, timeout=timeout, kind=_ROUND_KINDS[what])
    if maxs[0]:
        bad = maxs[1]
        raise InvalidInputError(f"{what}: rank {bad} (world rank {comm.world_ranks[bad]}) passed bad input: "
                                f"{_PROBLEMS[maxs[0]]}")
    for i, name in enumerate(names):
        if mins[2 + i] != maxs[2 + i]:
            at = 2 + len(fields) + i
            low, high = (comm.world_ranks[v % _RANK_SLOTS] for v in (mins[at], maxs[at]))
            if name == "dtypes":
                who = f"world rank {low} and world rank {high}"
            else:
                who = f"world rank {low}: {mins[2 + i]}, world rank {high}: {maxs[2 + i]}"
            raise InvalidInputError(f"{what}: ranks passed different {name} ({who})")


def dtype_key(buf) -> int:
    """A small stable integer naming a buffer's dtype, compared across ranks."""
    return zlib.crc32(str(getattr(buf, "dtype", type(buf).__name__)).replace("torch.", "").encode()) & 0x7FFFFFFF


def is_index(value, stop: int) -> bool:
    """An int (numpy ints too, not a bool) in [0, stop): a rank, a tag, an agreement flag."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and 0 <= value < stop


def allgather(comm, sendbuf, recvbuf, timeout) -> None:
    """``Communicator.allgather`` (see there)."""
    n, r = comm.size, comm.rank
    problem, fields = 0, [0, 0, 0]
    send_addr = None
    try:
        send_addr, send_bytes = buffers.raw(sendbuf, writable=False)
        recv_bytes = buffers.raw(recvbuf, writable=True)[1]
        fields = [send_bytes, recv_bytes, dtype_key(sendbuf)]
        if recv_bytes != n * send_bytes:
            problem = _RECV_SIZE
        elif dtype_key(recvbuf) != dtype_key(sendbuf):
            problem = _DTYPE_DIFFERS
    except InvalidInputError:
        problem = _NOT_A_BUFFER
    validate(comm, "allgather", problem, fields, ("sendbuf bytes", "recvbuf bytes", "dtypes"), timeout)
    blocks = _split_blocks(recvbuf, n)
    if buffers.raw(blocks[r], writable=True)[0] != send_addr:  # the in-place form needs no copy
        blocks[r][...] = sendbuf.reshape(-1)
    right, left = (r + 1) % n, (r - 1) % n
    for k in range(n - 1):
        comm.exchange(sends=[(right, blocks[(r - k) % n])], recvs=[(left, blocks[(r - k - 1) % n])],
                      tag=Tag.ALLGATHER, timeout=timeout)


def _split_blocks(buf, n):
    flat = buf.reshape(-1)
    per = flat.shape[0] // n  # validated: a multiple of n
    return [flat[i * per:(i + 1) * per] for i in range(n)]


def broadcast(comm, buf, root, timeout) -> None:
    """``Communicator.broadcast`` (see there)."""
    n, r = comm.size, comm.rank
    problem, fields = 0, [0, 0, 0]
    try:
        fields = [buffers.raw(buf, writable=True)[1], dtype_key(buf), 0]
        if not is_index(root, n):
            problem = _BAD_ROOT
        else:
            fields[2] = int(root)
    except InvalidInputError:
        problem = _NOT_A_BUFFER
    validate(comm, "broadcast", problem, fields, ("buffer bytes", "dtypes", "roots"), timeout)
    rel = (r - root) % n
    mask = 1
    while mask < n:  # receive from the parent
        if rel & mask:
            comm.exchange(recvs=[((r - mask) % n, buf)], tag=Tag.BROADCAST, timeout=timeout)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # send to the children
        if rel + mask < n and not rel & mask:
            comm.exchange(sends=[((r + mask) % n, buf)], tag=Tag.BROADCAST, timeout=timeout)
        mask >>= 1


def broadcast_bytes(comm, data: bytes | None, root, timeout) -> bytes:
    """``Communicator.broadcast_bytes`` (see there)."""
    length = np.array([0 if data is None else len(data)], np.int64)
    broadcast(comm, length, root, timeout)
    buf = np.frombuffer(data, np.uint8).copy() if data is not None else np.zeros(int(length[0]), np.uint8)
    broadcast(comm, buf, root, timeout)
    return buf.tobytes()
