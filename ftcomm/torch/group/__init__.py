"""The "ftcomm" process group: torch's ``dist`` API over an ftcomm communicator.

``process_group.py`` is the group (collectives, their recovery), ``backend.py`` registers it with
``torch.distributed``, ``rendezvous.py`` turns ``init_process_group``'s arguments into a
communicator, ``work.py`` and ``executor.py`` run collectives asynchronously, ``device.py`` stages
CUDA tensors through host memory, ``step_state.py`` and ``step_commit.py`` tie the collectives of
one training step to one commit, ``data_plane.py`` and ``gloo_plane.py`` move that step's
gradient buckets (ftcomm's ring, or an inner gloo group), ``models.py`` unwraps DDP. Calls
nothing above it in ``ftcomm.torch``.
"""
