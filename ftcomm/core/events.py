"""The one record of a recovery, shared by every layer.

``Communicator.recover`` makes a ``RecoveryEvent`` (what was done: policy, sizes, lost and
promoted ranks) and attaches it to the communicator it returns (``comm.recovery``); the layer
that drove the recovery fills in the rest: the elastic driver the step and the phase times of the
rebuild, the torch backend the collective that saw the failure and the hand-over time. The
elastic driver's JSON-lines log and ``ftcomm.torch.recoveries()`` both carry this record, so one
reader understands both. Times are in seconds.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field


@dataclass
class RecoveryEvent:
    """One recovery.

    Attributes:
        policy: what was done: "shrink", "spares" (idle spares took the failed ranks' places) or
            "respawn" (new processes did).
        fallback: why the policy asked for was not (fully) used ("spares exhausted", ...), or None.
        old_size, new_size: world size of the communicator before and after.
        lost_world_ranks: MPI_COMM_WORLD ranks lost in this failure, sorted.
        promoted: ranks (in the new communicator) of the newcomers; empty after a shrink.
        old_to_new: old rank -> new rank, -1 for a failed rank that was not replaced.
        unfilled: old ranks that failed and got no newcomer (spares ran out).
        step: the step the failure interrupted, counted from 1 as every step number in ftcomm
            is (``--kill RANK@STEP`` flags, logs, reports): step N is the N-th step, and its
            commit is "step N". The steps before it were committed; this one is redone (after a
            disk fallback, the steps after ``disk_restore`` are). None where no step ledger
            applies.
        where: the collective or training phase that saw the failure ("allreduce", "rebuild", ...).
        error: the class name of the error that started the recovery.
        time: ``time.time()`` when the recovery completed (Unix seconds).
        detected_time: ``time.time()`` when this rank saw the error that started it, or None.
        detection_s: from the start of the failed phase to the error (an upper bound of the time
            to detect, since the moment of the failure is not known to the survivors).
        agree_s: the agreement on the failed step, when it came after the error.
        recover_s: ``Communicator.recover`` (revoke, shrink, spare round).
        rebuild_s: rebuilding the training state (re-shard from replicas, or the disk restore).
        handover_s: the torch backend's hand-over to newcomers (their set-up included).
        bytes_moved: bytes the rebuild moved between ranks (whole job).
        from_replica: old shard ids that were taken from a buddy's replica.
        newcomers: ranks (new numbering) that joined without state.
        disk_restore: the step of the disk checkpoint restored, when in-memory recovery failed.
        in_resilient_step: torch backend: the failure hit a ``resilient`` loop's step (voided and
            redone) rather than a bare collective (which raised).
    """

    policy: str = "shrink"
    fallback: str | None = None
    old_size: int = 0
    new_size: int = 0
    lost_world_ranks: list = field(default_factory=list)
    promoted: list = field(default_factory=list)
    old_to_new: list = field(default_factory=list)
    unfilled: list = field(default_factory=list)
    step: int | None = None
    where: str = ""
    error: str = ""
    time: float = field(default_factory=time.time)
    detected_time: float | None = None
    detection_s: float | None = None
    agree_s: float | None = None
    recover_s: float | None = None
    rebuild_s: float | None = None
    handover_s: float | None = None
    bytes_moved: int = 0
    from_replica: list = field(default_factory=list)
    newcomers: list = field(default_factory=list)
    disk_restore: int | None = None
    in_resilient_step: bool = False

    def as_dict(self) -> dict:
        """A JSON-serialisable dict of every field."""
        return asdict(self)


def between(old, new, **fields) -> RecoveryEvent:
    """The event of a recovery from communicator ``old`` to ``new``: sizes, lost world ranks and
    ``old_to_new`` from the two, the rest from ``fields``."""
    lost = sorted(set(old.world_ranks) - set(new.world_ranks))
    fields.setdefault("old_to_new", list(new.old_to_new or []))
    return RecoveryEvent(old_size=old.size, new_size=new.size, lost_world_ranks=lost, **fields)


@dataclass
class CorruptionEvent:
    """One step voided because data arrived corrupted (``SilentCorruptionError``).

    Attributes:
        step: the voided step id; ranks: the implicated world ranks [sender, receiver];
        where: the collective ("allreduce", "gradient allreduce", ...); checked: what caught it
        ("ring chunk checksums"); action: what was done ("redone", "raised" when the retries ran
        out); time: ``time.time()``.
    """

    step: int | None
    ranks: list
    where: str
    checked: str = "ring chunk checksums"
    action: str = "redone"
    time: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return asdict(self)


# Every corruption this process saw, in order (``corruptions()``; the torch backend and the
# sharded optimizer append to it).
_CORRUPTIONS: list[CorruptionEvent] = []


def note_corruption(error, where: str, action: str) -> CorruptionEvent:
    """Records a ``SilentCorruptionError`` and what was done about it (``record_corruption``)."""
    return record_corruption(CorruptionEvent(step=error.step, ranks=list(getattr(error, "ranks", [])), where=where,
                                             checked=error.checked, action=action))


def record_corruption(event: CorruptionEvent) -> CorruptionEvent:
    """Keeps ``event`` for ``corruptions()`` and prints one line on stderr (every rank sees the
    same event, so every rank prints it)."""
    _CORRUPTIONS.append(event)
    print(f"ftcomm: silent data corruption at {event.where}, step {event.step}, world ranks {event.ranks} "
          f"({event.checked}): {event.action}", file=sys.stderr, flush=True)
    return event


def corruptions() -> list[CorruptionEvent]:
    """The corruption events of this process so far (a copy)."""
    return list(_CORRUPTIONS)
