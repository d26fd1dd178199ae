"""The "ftcomm" process group: torch's ``dist`` API over an ftcomm communicator.

``process_group.py`` is the group (collectives, their recovery), ``backend.py`` registers it with
``torch.distributed``, ``rendezvous.py`` turns ``init_process_group``'s arguments into a
communicator, ``work.py`` and ``executor.py`` run collectives asynchronously, ``device.py`` stages
CUDA tensors through host memory, ``step_state.py`` and ``step_commit.py`` tie the collectives of
one training step to one commit, ``data_plane.py`` picks what moves that step's gradient buckets
(``ring_plane.py``: ftcomm's ring; ``gloo_plane.py`` and ``nccl_plane.py``: an inner gloo or NCCL
group, both built on ``inner_group.py``), ``models.py`` unwraps DDP. Calls nothing above it in
``ftcomm.torch``.
"""
