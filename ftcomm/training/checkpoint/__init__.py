"""Disk checkpoints of committed steps: the tier under the in-memory replicas, for failures that
end the whole job (a lost node, the launcher killed, a rank lost with all its buddies).

Format: ``torch.distributed.checkpoint`` (DCP), so that torch's own tools read it
(``dcp.load``, ``format_utils.dcp_to_torch_save``); a checkpoint written at one world size loads
at any other, re-sharded. Every rank writes its part on its own and one rank joins the parts
(``dcp_parts``); directory layout and atomic completion in ``directory``; the asynchronous writer
(the step pays only for a copy to host memory) in ``writer``; when to checkpoint (every N steps,
or Young/Daly from measured costs) in ``interval``; what a model and a ``ShardedOptimizer``
contribute, and loading them back, in ``sharded``.

    ckpt = AsyncCheckpointer("ckpt/", every=10)          # or every="auto", mtbf_s=3600
    ...after each committed step, on every rank:
    ckpt.at_step(comm, step, lambda: entries)            # {name: Whole | Piece | Blob}
    ...at the end:
    ckpt.finish(comm)

``save(opt, model, dir)`` / ``restore_latest(opt, model, comm, dir)``: the same, synchronous, for a
``ShardedOptimizer``. ``ftcomm.elastic.run(checkpoint_dir=..., checkpoint_every=...)`` and
``ftcomm.torch.resilient(..., checkpoint_dir=..., checkpoint_every=...)`` do this, and resume from
the newest complete checkpoint when a script starts with one in its directory.
"""
from __future__ import annotations

import warnings

from .dcp_parts import Blob, Piece, Whole
from .directory import complete_steps, latest
from .sharded import restore_latest, save
from .writer import AsyncCheckpointer

# Every rank runs DCP alone (no_dist=True) by design; DCP warns about that on each call.
warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized",
                        category=UserWarning)

__all__ = ["AsyncCheckpointer", "Blob", "Piece", "Whole", "complete_steps", "latest", "restore_latest", "save"]
