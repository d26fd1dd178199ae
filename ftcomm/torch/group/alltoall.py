"""All-to-all for the torch backend: every rank sends a block to every rank, blocks of any size.

One round of the communicator's point-to-point ``exchange`` (every send and receive posted at
once, under one deadline), after an input check across ranks: each rank's split sizes go around
in a ring allgather, so that every rank sees the whole send matrix and raises the same
``InvalidInputError`` (naming world ranks and values) when rank i's block for rank j is not the
size rank j expects from i, or a rank's own splits do not add up. Nothing is sent then. The
outcome after the check is local (``exchange``'s); the process group's agreement after a
collective built on point-to-point makes it uniform (``ProcessGroupFtcomm._attempt``).

Traffic per rank: what it sends and receives, nothing more (the check: N x (2N + 3) int64).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...core.codes import Tag
from ...errors import InvalidInputError
from .host_bytes import byte_view

# A rank's own problem, sent with its splits (the first rank with one is named on every rank).
_OK, _SPLITS_LEN, _NEGATIVE, _SUM, _UNEVEN, _ROW, _DTYPE = range(7)
_PROBLEMS = {
    _SPLITS_LEN: "gives {value} split sizes for a group of {n}",
    _NEGATIVE: "gives a negative split size ({value})",
    _SUM: "gives split sizes that add up to {value}, not the rows of its tensor",
    _UNEVEN: "has {value} rows, which do not split evenly over {n} ranks (no split sizes given)",
    _ROW: "has rows of another size in its input ({value} elements) than in its output",
    _DTYPE: "has tensors of different dtypes in one all-to-all",
}


def splits_of(rows: int, splits, n: int, even_when_empty: bool = True) -> tuple[list[int], int, int]:
    """(split sizes, this rank's problem code, the value it names) of ``rows`` rows of dim 0."""
    if even_when_empty and not splits:
        if rows % n:
            return [0] * n, _UNEVEN, rows
        return [rows // n] * n, _OK, 0
    splits = [int(s) for s in splits]
    if len(splits) != n:
        return [0] * n, _SPLITS_LEN, len(splits)
    if min(splits) < 0:
        return [0] * n, _NEGATIVE, min(splits)
    if sum(splits) != rows:
        return [0] * n, _SUM, sum(splits)
    return splits, _OK, 0


def _rows(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() else 1


def _row_elements(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) if t.dim() else 1


def check_splits(comm, name: str, timeout, sends, recvs, problem: int, value: int, row_bytes: int) -> None:
    """The uniform input check of this rank's ``sends`` and ``recvs`` (rows per rank) and its own
    ``problem`` (0: none) with the ``value`` it names; ``row_bytes``: bytes per row.

    Raises:
        InvalidInputError: on every rank alike, as the module docstring says.
    """
    n = comm.size
    mine = np.array([*sends, *recvs, problem, value, row_bytes], np.int64)
    table = np.empty((n, mine.size), np.int64)
    comm.allgather(mine, table.reshape(-1), timeout=timeout)
    world = comm.world_ranks
    for i in range(n):
        if table[i, 2 * n]:
            text = _PROBLEMS[int(table[i, 2 * n])].format(value=int(table[i, 2 * n + 1]), n=n)
            raise InvalidInputError(f"{name}: world rank {world[i]} {text}")
    row_bytes = [int(b) for b in table[:, 2 * n + 2]]
    if len(set(row_bytes)) > 1:
        raise InvalidInputError(f"{name}: the ranks' rows differ in size: {row_bytes} bytes, by rank")
    for i in range(n):
        for j in range(n):
            sent, expected = int(table[i, j]), int(table[j, n + i])
            if sent != expected:
                raise InvalidInputError(f"{name}: world rank {world[i]} sends {sent} rows to world rank "
                                        f"{world[j]}, which expects {expected} from it")


def alltoall_single(comm, output: torch.Tensor, input: torch.Tensor, out_splits, in_splits,  # noqa: A002
                    timeout) -> None:
    """``output``'s block j (rows of dim 0, ``out_splits[j]`` of them; even blocks when empty)
    receives rank j's block for this rank of its ``input`` (``in_splits``). Host tensors."""
    n = comm.size
    sends, problem, value = splits_of(_rows(input), in_splits, n)
    recvs, out_problem, out_value = splits_of(_rows(output), out_splits, n)
    if not problem:
        problem, value = out_problem, out_value
    if not problem and input.dtype != output.dtype:
        problem = _DTYPE
    if not problem and _row_elements(input) != _row_elements(output):
        problem, value = _ROW, _row_elements(input)
    check_splits(comm, "all_to_all_single", timeout, sends, recvs, problem, value,
                 _row_elements(input) * input.element_size())
    row = _row_elements(input)
    into = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
    exchange(comm, list(torch.split(input.contiguous().reshape(-1), [s * row for s in sends])),
             list(torch.split(into.reshape(-1), [r * row for r in recvs])), timeout)
    if into is not output:
        output.copy_(into)


def alltoall(comm, outputs: list, inputs: list, timeout) -> None:
    """``outputs[j]`` receives rank j's ``inputs[rank]``: host tensors of one dtype, of any sizes
    that pair up (checked as rows of one element)."""
    n = comm.size
    sends, problem, value = splits_of(sum(t.numel() for t in inputs), [t.numel() for t in inputs], n, False)
    recvs, out_problem, out_value = splits_of(sum(t.numel() for t in outputs), [t.numel() for t in outputs], n,
                                              False)
    if not problem:
        problem, value = out_problem, out_value
    if not problem and len({t.dtype for t in (*inputs, *outputs)}) > 1:
        problem = _DTYPE
    check_splits(comm, "all_to_all", timeout, sends, recvs, problem, value, inputs[0].element_size() if inputs else 0)
    into = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format) for t in outputs]
    exchange(comm, [t.contiguous().reshape(-1) for t in inputs], [t.reshape(-1) for t in into], timeout)
    for t, got in zip(outputs, into):
        if got is not t:
            t.copy_(got)


def exchange(comm, send_blocks: list, recv_blocks: list, timeout) -> None:
    """Block j of ``send_blocks`` to rank j, block j of ``recv_blocks`` from it (this rank's own
    block copied), in one ``exchange``; empty blocks are not sent."""
    me = comm.rank
    recv_blocks[me].copy_(send_blocks[me])
    sends = [(j, byte_view(b)) for j, b in enumerate(send_blocks) if j != me and b.numel()]
    recvs = [(j, byte_view(b)) for j, b in enumerate(recv_blocks) if j != me and b.numel()]
    comm.exchange(sends=sends, recvs=recvs, tag=Tag.ALLTOALL, timeout=timeout)
