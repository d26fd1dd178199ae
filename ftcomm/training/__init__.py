"""Training state that survives rank failures, without disk. Above core and membership; needs
torch (for its kernels and ``torch.save``), so ``import ftcomm`` loads it only on first use.

- ``layout``: ZeRO-1 shard layout and re-shard plans; ``buddies``: who keeps which replica.
- ``replica``: checksummed, double-buffered replicas in buddies' host memory.
- ``stepper``: one shard's update by any elementwise ``torch.optim`` optimizer; ``optimizer``:
  ``ShardedOptimizer`` (one agreement per step commits it); ``rebuild``: re-shard from replicas after a failure.
- ``data``: ``ElasticSampler``, the data position as state; ``checkpoint``: asynchronous disk
  checkpoints in ``torch.distributed.checkpoint`` format, and resuming from them at any world size.
- ``elastic``: the driver that runs steps, recovers and redoes; ``events``: its JSON-lines log.
"""
from .data import ElasticSampler
from .optimizer import ShardedOptimizer

__all__ = ["ElasticSampler", "ShardedOptimizer"]
