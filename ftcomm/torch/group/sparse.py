"""Allreduce (SUM) of a sparse COO tensor, as gloo's CPU backend offers it (sparse gradients of
``nn.Embedding(sparse=True)`` under DDP).

Every rank's nonzeros are gathered to every rank and summed there: first each rank's count of
nonzeros, numbers of dimensions and dtype, then its shape (two small allgathers of int64s), then
its indices and its values, each padded to the largest count (two more allgathers); the sum is
the coalesced COO tensor of all of them, copied into the caller's tensor in place. The bytes moved grow with the ranks' total
nonzeros, not the dense size: this is worth it while the tensors are sparse.
"""
from __future__ import annotations

import zlib

import torch

from ...errors import InvalidInputError
from .host_bytes import byte_view


def allreduce_sum(comm, tensor: torch.Tensor, timeout: float) -> None:
    """Sums the CPU sparse COO ``tensor`` (any shape and dtype, the same on every rank) over
    ``comm`` in place. A local outcome, as ``Communicator.allgather``.

    Raises:
        InvalidInputError: on every rank, when the ranks' shapes, numbers of sparse dimensions or
            dtypes differ, naming the world ranks and the values.
        ProcFailedError, RevokedError, CollectiveTimeoutError: as ``Communicator.allgather``.
    """
    local = tensor.coalesce()
    indices, values = local.indices().contiguous(), local.values().contiguous()
    # Fixed-length first, so that ranks differing in any of it get this message, not a size mismatch
    header = torch.tensor([indices.shape[1], local.sparse_dim(), local.dim(), _dtype_code(local.dtype)],
                          dtype=torch.int64)
    headers = _gathered(comm, header, timeout)
    _check_same(comm, headers[:, 1:], "sparse dims, dims and dtype code", local.dtype)
    _check_same(comm, _gathered(comm, torch.tensor(local.shape, dtype=torch.int64), timeout), "shape", local.dtype)
    counts = headers[:, 0].tolist()
    most = max(counts)
    index_rows = _gathered(comm, _padded(indices, 1, most), timeout)           # (ranks, sparse_dim, most)
    value_rows = _gathered(comm, _padded(values, 0, most), timeout)            # (ranks, most, *dense)
    every_index = torch.cat([index_rows[r, :, :count] for r, count in enumerate(counts)], dim=1)
    every_value = torch.cat([value_rows[r, :count] for r, count in enumerate(counts)], dim=0)
    total = torch.sparse_coo_tensor(every_index, every_value, local.shape, check_invariants=True).coalesce()
    tensor.copy_(total)


def _gathered(comm, piece: torch.Tensor, timeout: float) -> torch.Tensor:
    """Every rank's ``piece`` (same shape and dtype on every rank), stacked in rank order."""
    piece = piece.contiguous()
    out = torch.empty((comm.size,) + tuple(piece.shape), dtype=piece.dtype)
    comm.allgather(byte_view(piece), byte_view(out), timeout=timeout)
    return out


def _padded(t: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """``t`` extended with zeros along ``dim`` to ``length``."""
    shape = list(t.shape)
    shape[dim] = length - t.shape[dim]
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype)], dim=dim)


def _dtype_code(dtype: torch.dtype) -> int:
    """A number for ``dtype``, the same in every process (its name's CRC-32)."""
    return zlib.crc32(str(dtype).encode())


def _check_same(comm, rows: torch.Tensor, what: str, dtype: torch.dtype) -> None:
    """Raises on every rank (each holds the same ``rows``) when a rank's row differs from rank 0's."""
    for r in range(comm.size):
        if not torch.equal(rows[r], rows[0]):
            raise InvalidInputError(
                f"sparse allreduce on world rank {comm.world_rank}: world rank {comm.world_ranks[r]} gives {what} "
                f"{rows[r].tolist()}, world rank {comm.world_ranks[0]} {rows[0].tolist()} (this rank's dtype: {dtype})")
