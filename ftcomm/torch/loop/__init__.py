"""The resilient training loop, ``resilient(loader, ...)`` (``loader.py``): a failed step voided
and redone, the epoch's samples re-split over the new world size (``resplit.py``), a spare's
hand-over (``join.py``), disk checkpoints (``checkpoint.py``) and the warm tier in node-local
shared memory (``warm.py``, ``model_memory.py``). The top of ``ftcomm.torch``: calls every other
sub-package.
"""
