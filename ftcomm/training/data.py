"""The data position as part of the training state: an elastic, resumable distributed sampler.

Each epoch is one permutation of the sample indices, drawn from ``seed + epoch`` (so every rank,
and every survivor after a shrink, computes the same one). A step consumes the next global batch
of ``batch_size`` indices, split over the current world size into near-equal contiguous parts
(``numpy.array_split``). The committed state is only ``(epoch, cursor)``: after a shrink the
survivors re-split the samples left in the epoch over the new world size, so within an epoch no
sample is skipped and none is used twice by a committed step (the redone step reuses the aborted
step's global batch, whose gradient was never applied).
"""
from __future__ import annotations

import numpy as np


class ElasticSampler:
    """Global-batch sampler whose position survives world-size changes.

    Args:
        num_samples: dataset size.
        batch_size: global batch size (samples per step over all ranks).
        seed: permutation seed; epoch e uses ``default_rng(seed + e)``.
        shuffle: permute each epoch (default True); False walks 0..num_samples-1.

    The last batch of an epoch holds the remaining ``num_samples % batch_size`` samples (no drop).
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if num_samples < 1 or batch_size < 1:
            raise ValueError("num_samples and batch_size must be positive")
        self.num_samples, self.batch_size, self.seed, self.shuffle = num_samples, batch_size, seed, shuffle
        self.epoch = 0
        self.cursor = 0  # samples of this epoch consumed by committed steps
        self._perm_epoch, self._perm = None, None

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's order of sample indices (int64, length num_samples)."""
        if self._perm_epoch != epoch:
            self._perm = (np.random.default_rng(self.seed + epoch).permutation(self.num_samples)
                          if self.shuffle else np.arange(self.num_samples))
            self._perm_epoch = epoch
        return self._perm

    def global_batch(self) -> np.ndarray:
        """Indices of the next step's global batch (int64, at most batch_size)."""
        return self.permutation(self.epoch)[self.cursor:self.cursor + self.batch_size]

    def local_indices(self, rank: int, size: int) -> np.ndarray:
        """This rank's part of the next global batch (may be empty when size > batch)."""
        return np.array_split(self.global_batch(), size)[rank]

    def position_after_step(self) -> dict:
        """The position once the next global batch is consumed (what a committed step leaves):
        {"epoch", "cursor"}."""
        cursor = self.cursor + len(self.global_batch())
        if cursor >= self.num_samples:
            return {"epoch": self.epoch + 1, "cursor": 0}
        return {"epoch": self.epoch, "cursor": cursor}

    def state_dict(self) -> dict:
        """JSON-serialisable position: {"epoch", "cursor"}."""
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
