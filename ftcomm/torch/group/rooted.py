"""The rooted collectives of the torch backend: reduce, gather, scatter, on ftcomm's collectives.

Each is one collective of the communicator whose input check runs across ranks first, so that a
tensor of the wrong size on any rank is the same ``InvalidInputError`` on every rank (naming the
world rank) and never a hang:

- reduce: a committed ring allreduce (``Communicator.allreduce``) of a copy on the other ranks;
- gather: a ring allgather (``Communicator.allgather``), of which the root keeps the blocks;
- scatter: a tree broadcast (``Communicator.broadcast``) of the root's concatenated inputs, of
  which each rank keeps its block.

Their outcome is uniform: the allreduce's by its commit, the others' by the agreement the process
group runs after a collective built on point-to-point (``ProcessGroupFtcomm._attempt``). They move
more bytes than a direct rooted algorithm would (allreduce's 2(N-1)/N x size; N x S to every rank
for gather and scatter): the price of reusing collectives whose failure handling is tested.

``root`` is a world rank: after a shrink the root keeps its place if it survived; if it died,
the collective cannot be redone (``RootLost``, on every survivor alike).
"""
from __future__ import annotations

import torch

from ...errors import ProcFailedError
from .host_bytes import byte_view


class RootLost(ProcFailedError):
    """The root of a rooted collective died: the survivors cannot redo it. Raised alike on every
    survivor before any communication (the process group does not recover again for it)."""


def root_rank(comm, root_world: int, name: str) -> int:
    """The communicator rank of world rank ``root_world``.

    Raises:
        RootLost: it is no longer a member.
    """
    if root_world not in comm.world_ranks:
        raise RootLost(f"{name}: the root, world rank {root_world}, failed; the survivors cannot redo the "
                       "collective without it")
    return comm.world_ranks.index(root_world)


def reduce(comm, tensor: torch.Tensor, root_world: int, op: str, timeout) -> None:
    """``tensor`` on the root receives the reduction over ranks (``op``: sum, avg, min, max, prod);
    on the other ranks it is left as it was (they reduce a copy)."""
    root = root_rank(comm, root_world, "reduce")
    mine = comm.rank == root and tensor.is_contiguous()
    work = tensor if mine else tensor.clone(memory_format=torch.contiguous_format)
    comm.allreduce([work], op=op, timeout=timeout)
    if comm.rank == root and work is not tensor:
        tensor.copy_(work)


def gather(comm, outputs: list, tensor: torch.Tensor, root_world: int, timeout) -> None:
    """The root's ``outputs[j]`` (one per rank, each ``tensor``'s size and dtype) receive rank j's
    ``tensor``; ``outputs`` is empty on the other ranks."""
    n, root = comm.size, root_rank(comm, root_world, "gather")
    src = tensor.contiguous()
    blocks = n * src.numel()
    if comm.rank == root and not _fits(outputs, n, src):
        # One element more than the blocks: the allgather's input check then fails on every rank,
        # naming this rank, instead of this rank alone raising while the others wait.
        blocks += 1
    flat = torch.empty(blocks, dtype=src.dtype)
    comm.allgather(byte_view(src), byte_view(flat), timeout=timeout)
    if comm.rank == root:
        for j, out in enumerate(outputs):
            out.copy_(flat.view(n, src.numel())[j].view_as(out))


def scatter(comm, output: torch.Tensor, inputs: list, root_world: int, timeout) -> None:
    """``output`` on rank j receives the root's ``inputs[j]`` (one per rank, each ``output``'s
    size and dtype); ``inputs`` is empty on the other ranks."""
    n, root = comm.size, root_rank(comm, root_world, "scatter")
    if comm.rank == root:
        flat = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0, dtype=output.dtype)
        if not _fits(inputs, n, output):
            flat = torch.empty(n * output.numel() + 1, dtype=output.dtype)  # fails the broadcast's check everywhere
    else:
        flat = torch.empty(n * output.numel(), dtype=output.dtype)
    flat = flat.contiguous()
    comm.broadcast(byte_view(flat), root=root, timeout=timeout)
    output.copy_(flat.view(n, output.numel())[comm.rank].view_as(output))


def _fits(tensors: list, n: int, like: torch.Tensor) -> bool:
    return len(tensors) == n and all(t.numel() == like.numel() and t.dtype == like.dtype for t in tensors)
