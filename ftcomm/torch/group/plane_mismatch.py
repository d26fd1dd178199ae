"""What a data plane adds to a ``CollectiveMismatchError`` raised inside it.

Ranks that differ on ``FTCOMM_DATA_PLANE`` call different collectives for the same gradient
bucket: the ring's allreduce on one rank, the broadcast that makes an inner group on another. The
core's input check finds that and raises ``CollectiveMismatchError`` on every rank, naming the
collectives but not the setting behind them; each rank adds its own plane, so that the ranks'
messages together show which setting differs and where.
"""
from __future__ import annotations

from contextlib import contextmanager

from ...errors import CollectiveMismatchError


@contextmanager
def naming_the_plane(plane_name: str, comm):
    """Re-raises a ``CollectiveMismatchError`` of the block, a collective over ``comm``, with this
    rank's data plane named."""
    try:
        yield
    except CollectiveMismatchError as error:
        raise CollectiveMismatchError(
            f"{error}. World rank {comm.world_rank} moves a resilient step's buckets on the {plane_name!r} data plane "
            "(FTCOMM_DATA_PLANE): ranks that differ on it call different collectives here; it must be the same "
            "on every rank") from None
