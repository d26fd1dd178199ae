"""What the backend needs of a user's model: the module inside DDP's wrapper, whose
``state_dict()`` names its tensors without DDP's ``module.`` prefix."""
from __future__ import annotations


def unwrap(model):
    """The module a ``DistributedDataParallel`` wraps (``model.module``), else ``model`` itself."""
    return getattr(model, "module", model)
