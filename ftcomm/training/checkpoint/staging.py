"""Staging: the one part of an asynchronous checkpoint the training step waits for.

A committed step's state is copied into host buffers that belong to the checkpoint (the model
and optimizer go on changing in the next step while the background writer reads the copies).
The buffers are kept from one checkpoint to the next, one per entry, so after the first
checkpoint staging allocates nothing; device tensors are copied into page-locked buffers on the
current stream, which is then synchronised once for all of them.
"""
from __future__ import annotations

import copy
import time

import torch

from .dcp_parts import Blob, Piece, Whole


class StagingBuffers:
    """Host buffers reused across checkpoints, one per entry name.

    Attributes:
        nbytes: bytes of the buffers held now.
        last_s: seconds the last ``stage`` took (the step's stall).
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self.last_s = 0.0

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=like.is_cuda)
            self._buffers[name] = buf
        return buf

    def stage(self, entries: dict) -> dict:
        """Copies of ``entries`` ({name: Whole | Piece | Blob}) whose tensors are this object's
        host buffers and whose objects are deep copies. The caller must not stage again while a
        writer still reads the previous copies."""
        t0 = time.perf_counter()
        staged, on_device = {}, False
        for name, entry in entries.items():
            if isinstance(entry, Blob):
                staged[name] = Blob(copy.deepcopy(entry.value))
                continue
            src = entry.tensor.detach()
            buf = self._buffer(name, src)
            buf.copy_(src, non_blocking=src.is_cuda)
            on_device |= src.is_cuda
            staged[name] = Whole(buf) if isinstance(entry, Whole) else Piece(buf, entry.offset, entry.global_len)
        if on_device:
            torch.cuda.current_stream().synchronize()  # the copies must land before the writer reads
        self.last_s = time.perf_counter() - t0
        return staged
