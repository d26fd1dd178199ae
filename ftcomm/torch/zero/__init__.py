"""ZeRO on the "ftcomm" group: ``optimizer.py`` (``ZeroRedundancyOptimizer``, torch optimizers
over ftcomm's ``ShardedOptimizer`` with buddy replicas), ``host_master.py`` (float32 host
copies of device parameters), ``device_shard.py`` (the shard kept on the GPU). Calls only
``group`` in ``ftcomm.torch``.
"""
