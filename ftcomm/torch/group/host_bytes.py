"""Host tensors as the byte buffers ftcomm's collectives move (any dtype goes as bytes)."""
from __future__ import annotations

import torch


def byte_view(t: torch.Tensor):
    """A uint8 numpy view of a contiguous CPU tensor's memory (any dtype; shares memory)."""
    return t.reshape(-1).view(torch.uint8).numpy()
