"""Non-shrinking recovery: spare ranks take the failed ranks' places, back to the full world size.

Spares, after Fenix's spare pool (Gamell et al., "Exploring Automatic, Online Failure Recovery
for Scientific Applications at Extreme Scales", SC'14): ``ftcomm-run --spares S -n N`` starts
N + S processes and sets FTCOMM_SPARES=S. The last S ranks of MPI_COMM_WORLD are spares:
``ftcomm.world()`` on a spare never returns to the program until the spare is promoted, and ends
the process (status 0) when the job finishes without needing it. The *pool* is a communicator
over every live process, actives and spares; recovery with ``policy="spares"`` is collective
over the pool:

    1. the survivors revoke the pool; the idle spares, waiting on it, wake up;
    2. everyone shrinks the pool (MPIX_Comm_shrink);
    3. one allgather over the new pool of (slot, world size, step ledger): a survivor's slot is
       the rank it held, a spare's is -1;
    4. every member computes the same assignment: the failed ranks' slots, lowest first, go to
       the spares in pool order; if the spares run out, the slots left over are closed the way
       shrink closes them (ranks consecutive, in the old order) and the fallback is logged;
    5. MPI_Comm_split of the pool, key = slot: the new active communicator, its size and every
       survivor's rank as before; spares not promoted go back to waiting on the new pool;
    6. an agreement over the pool: any failure in 2-5 makes everyone start over at 1.

Respawn (``respawn.py``) runs 3-5 over ``MPI_Comm_spawn`` + ``MPI_Intercomm_merge`` instead of
the pool. docs/SPARES.md says what works with Open MPI 5.0.x and what does not.
"""
from __future__ import annotations

import logging
import sys
import time

import numpy as np

from ..core import liveness, runtime
from ..core.codes import Tag
from ..core.communicator import Communicator
from ..core.events import RecoveryEvent, between
from ..core.outcome import agreed, retrying
from ..errors import FtError, InvalidInputError, ProcFailedError
from . import nodes

log = logging.getLogger("ftcomm.recovery")

_RELEASE, _CRASHED = 1, 2  # what an active rank tells an idle spare: the job is done, or it crashed
_INFO = 3  # ints per member in the assignment allgather: slot, world size, step ledger


class SparePool:
    """Every live process of the job (actives and idle spares), and which of them are active.

    Attributes:
        comm: Communicator over the pool (all live processes, MPI_COMM_WORLD order).
        active_world: MPI_COMM_WORLD ranks of the active ranks.
        events: one ``RecoveryEvent`` per recovery round this process took part in.
    """

    def __init__(self, comm, active_world, timeout: float):
        self.comm, self.active_world, self.timeout = comm, set(active_world), timeout
        self.events: list[RecoveryEvent] = []
        self.crashed: set[int] = set()  # world ranks of actives that ended by an exception

    @property
    def is_spare(self) -> bool:
        return self.comm.world_rank not in self.active_world

    @property
    def idle_spares(self) -> list[int]:
        """Pool ranks of the spares not yet promoted."""
        return [r for r, w in enumerate(self.comm.world_ranks) if w not in self.active_world]

    # -- the spare's side ---------------------------------------------------------------------
    def wait_for_promotion(self):
        """Blocks until this spare is promoted (returns the active Communicator, ``promoted``
        True) or released at the end of the job (ends the process with status 0).

        Raises:
            ProcFailedError: every active rank failed, so nobody is left to promote it.
        """
        while True:
            try:
                value, source = self.comm.wait_signal(Tag.SPARE_WAKE, timeout=None)
            except FtError as error:
                if not self.comm.is_revoked:
                    self._check_actives_alive(error)
                    continue  # a failure was noticed: wait for the survivors' revoke
                active = self.rebuild_pool(slot=-1, size=0, ledger=-1)
                if active is not None:
                    return active
                continue
            if value == _RELEASE:
                log.info("spare (world rank %d) released by rank %d: the job is done",
                         self.comm.world_rank, source)
                sys.exit(0)
            if value == _CRASHED:
                self.crashed.add(self.comm.world_ranks[source])
                if self.active_world <= self.crashed | self._failed_world():
                    log.warning("spare (world rank %d): every active rank crashed or failed; leaving",
                                self.comm.world_rank)
                    sys.exit(0)

    def _failed_world(self) -> set[int]:
        """World ranks of the pool's members that this spare knows failed (acknowledged)."""
        return {self.comm.world_ranks[r] for r in self.comm.failed_ranks()}

    def _check_actives_alive(self, error) -> None:
        failed = self._failed_world()
        if self.active_world and self.active_world <= failed:
            raise ProcFailedError(f"spare: every active rank failed ({sorted(failed)}); nothing to join") from error

    # -- the survivors' side ------------------------------------------------------------------
    def refill(self, old):
        """Survivor side of ``Communicator.recover(policy="spares")`` (``old`` is the
        communicator that failed). Returns the new active Communicator."""
        self.comm.revoke()  # wakes the idle spares
        return self.rebuild_pool(slot=old.rank, size=old.size, ledger=old.last_committed_step)

    def release(self, crashed: bool = False, timeout: float = 5.0) -> None:
        """Tells every idle spare that the job is done (each active calls it at exit; a spare
        leaves on the first release, so one surviving active is enough), or, from an active that
        ends by an exception, that it crashed: the spare stays for its survivors' recovery, and
        leaves once every active crashed or failed."""
        if self.is_spare or self.comm.is_revoked:
            return
        idle = self.idle_spares
        for peer in idle:
            try:
                self.comm.signal(peer, Tag.SPARE_WAKE, _CRASHED if crashed else _RELEASE, timeout)
            except FtError:
                pass  # that spare is gone; others still get theirs
        if not crashed:
            _fence_stuck(self.comm.world_ranks[p] for p in idle)

    # -- the round, run by everyone in the pool ---------------------------------------------------
    def rebuild_pool(self, slot: int, size: int, ledger: int):
        """Steps 2-6 of the module docstring, repeated until one round completes everywhere: a
        round that fails anywhere fails the agreement everywhere, and the next round starts from
        the pool as the failed round shrank it. Returns the new active Communicator, or None on
        a spare that stays idle."""
        t0 = time.perf_counter()
        pool = self.comm

        def next_round(_error) -> None:
            self.comm = pool

        for attempt in retrying(None, on_failure=next_round):
            with attempt:
                pool = self.comm.recover(timeout=self.timeout, policy="shrink")  # the pool is revoked
                with agreed(pool, "spare pool round", timeout=self.timeout):
                    active, the_plan = assemble(pool, slot, size, ledger, self.timeout, "spares")
        self.comm = pool
        self.active_world = set(the_plan["active_world"])
        event = recovery_event(the_plan, "spares", recover_s=time.perf_counter() - t0)
        if active is not None:
            active.recovery = event
        self.events.append(event)
        return active


def _fence_stuck(world_ranks, wait_s: float = 3.0, silent_s: float = 1.0) -> None:
    """After the release: a spare that is still running ``wait_s`` later and has been silent for
    ``silent_s`` is stuck (stopped, or hung), and would keep the job from ending: SIGKILL it
    (on this host; ftcomm.core.liveness). A live idle spare beats every few milliseconds."""
    pending = list(world_ranks)
    end = time.monotonic() + wait_s
    while pending and time.monotonic() < end:
        pending = [w for w in pending if not liveness.finished(w)]
        time.sleep(0.01)
    if pending:
        liveness.fence_silent(pending, silent_s)


def assemble(group, slot: int, size: int, ledger: int, timeout: float, policy: str):
    """Steps 3-5 over ``group`` (the shrunk pool, or the merge of survivors and respawned
    processes): returns (the new active Communicator or None, the ``plan``). Every member
    computes the same plan from the same allgather. The active Communicator has ``promoted``
    (True on a newcomer), ``old_to_new`` and ``recovery`` (a ``RecoveryEvent`` with ``policy``).

    Raises:
        ProcFailedError etc.: a member failed (a local outcome: the caller agrees and retries).
    """
    mine = np.array([slot, size, ledger], np.int64)
    table = np.empty(group.size * _INFO, np.int64)
    group.allgather(mine, table, timeout=timeout)
    the_plan = plan(table.reshape(group.size, _INFO), list(group.world_ranks))
    member = the_plan["new_rank_of_member"]
    active = group.split(0 if group.rank in member else -1, member.get(group.rank, 0), timeout)
    if active is None:
        return None, the_plan
    active.set_ledger(the_plan["ledger"])
    active.promoted, active.old_to_new = slot < 0, the_plan["old_to_new"]
    active.recovery = recovery_event(the_plan, policy)
    return active, the_plan


def recovery_event(the_plan: dict, policy: str, **fields) -> RecoveryEvent:
    """The ``RecoveryEvent`` of an assignment ``plan``."""
    return RecoveryEvent(policy=policy, old_size=the_plan["size"], new_size=the_plan["new_size"],
                         promoted=list(the_plan["promoted"]), old_to_new=list(the_plan["old_to_new"]),
                         unfilled=list(the_plan["unfilled"]), step=the_plan["ledger"], **fields)


def plan(table: np.ndarray, world_ranks: list) -> dict:
    """The assignment of step 4, from the allgathered ``table`` (one row per member of the
    group: slot, world size, step ledger; slot -1 = spare or respawned process).

    Returns a dict: ``size`` (the world size to restore), ``new_rank_of_member`` (group rank ->
    new active rank), ``promoted`` (new ranks of the newcomers), ``old_to_new`` (old rank -> new
    rank, -1 for a failed rank left unfilled), ``unfilled`` (failed slots without a newcomer),
    ``ledger`` (the survivors' last committed step), ``active_world`` (world ranks of the new
    active communicator, in rank order).
    """
    slots = [int(s) for s in table[:, 0]]
    size = int(table[:, 1].max())
    held = {s: m for m, s in enumerate(slots) if s >= 0}
    newcomers = [m for m, s in enumerate(slots) if s < 0]
    holes = [s for s in range(size) if s not in held]
    filled = dict(zip(holes, newcomers))  # slot -> member
    unfilled = holes[len(filled):]
    by_slot = sorted([*held.items(), *filled.items()])  # (slot, member), slot order
    new_rank_of_member = {m: i for i, (_, m) in enumerate(by_slot)}
    old_to_new = [new_rank_of_member[held[s]] if s in held else -1 for s in range(size)]
    return {
        "size": size,
        "new_size": len(by_slot),
        "new_rank_of_member": new_rank_of_member,
        "promoted": sorted(new_rank_of_member[m] for m in filled.values()),
        "replaced": {new_rank_of_member[m]: s for s, m in filled.items()},
        "old_to_new": old_to_new,
        "unfilled": unfilled,
        "ledger": int(table[:, 2].max()),
        "active_world": [world_ranks[m] for _, m in by_slot],
    }


# -- process-wide pool -------------------------------------------------------------------------
_pool: SparePool | None = None


def pool() -> SparePool | None:
    """The job's spare pool, once ``ftcomm.world()`` made one (FTCOMM_SPARES > 0)."""
    return _pool


def start(spares: int, timeout: float):
    """Builds the pool over MPI_COMM_WORLD and the active communicator over its first
    ``size - spares`` ranks. Returns the active Communicator, or, on a spare, waits (see
    ``SparePool.wait_for_promotion``).

    Raises:
        InvalidInputError: ``spares`` is negative or leaves no active rank (on every rank).
    """
    global _pool
    from mpi4py import MPI

    world_size = MPI.COMM_WORLD.Get_size()
    if not 0 <= spares < world_size:
        raise InvalidInputError(f"FTCOMM_SPARES={spares}: need 0 <= spares < {world_size} processes")
    pool_comm = Communicator(MPI.COMM_WORLD, timeout=timeout)
    nodes.register(pool_comm, timeout)  # newcomers must know every rank's node (buddy placement)
    n_active = world_size - spares
    _pool = SparePool(pool_comm, range(n_active), timeout)
    me = pool_comm.rank
    active = pool_comm.split(0 if me < n_active else -1, me, timeout)
    if active is None:
        return _pool.wait_for_promotion()
    return active


def release_at_exit(crashed: bool = False) -> None:
    """A shutdown hook (``ftcomm.core.runtime.at_shutdown``): an active rank releases the idle
    spares (see ``SparePool.release``)."""
    if _pool is not None:
        try:
            _pool.release(crashed)
        except Exception:  # noqa: BLE001  (exit path: never raise)
            pass


def recover_with_spares(old, timeout: float):
    """``old.recover(policy="spares")`` (see ``Communicator.recover``)."""
    p = _pool
    if p is None or not p.idle_spares:
        reason = "no spare pool (start the job with ftcomm-run --spares S)" if p is None else "spares exhausted"
        return shrink_instead("spares", old, old.shrink_to_survivors(timeout), reason)
    if not old.is_revoked:
        old.revoke()  # peers still blocked on the failed communicator leave it
    new = p.refill(old)
    finish_recovery(old, new, "spares")
    return new


def shrink_instead(policy: str, old, shrunk, reason: str):
    """The fallback of a policy that cannot bring newcomers: the survivors' communicator, with
    the reason logged and kept in ``recovery.fallback``."""
    log.warning("recover(policy=%r): %s; shrinking instead", policy, reason)
    shrunk.recovery = between(old, shrunk, policy="shrink", fallback=reason)
    return shrunk


def finish_recovery(old, new, policy: str) -> None:
    """Completes ``new.recovery`` once survivors and newcomers form ``new``: the lost world ranks
    (also recorded for the exit report), and the fallback when spares ran out."""
    event = new.recovery
    event.lost_world_ranks = sorted(set(old.world_ranks) - set(new.world_ranks))
    runtime.record_lost(event.lost_world_ranks)
    if event.unfilled:
        log.warning("recover(policy=%r): spares exhausted, %d failed rank(s) not replaced; world size "
                    "%d -> %d", policy, len(event.unfilled), old.size, new.size)
        event.fallback = "spares exhausted"
