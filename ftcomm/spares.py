"""Non-shrinking recovery (issue 8): spare ranks, and respawn, back to the full world size.

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

Respawn (``policy="respawn"``) does 3-5 over ``MPI_Comm_spawn`` + ``MPI_Intercomm_merge`` instead
of the pool: new processes run the same program, and ``ftcomm.world()`` in them joins the merge.
See docs/SPARES.md for what works with Open MPI 5.0.x and what does not.
"""
from __future__ import annotations

import logging
import os
import sys
import time

import numpy as np

from .errors import FtError, InvalidInputError, ProcFailedError

log = logging.getLogger("ftcomm.recovery")

POLICIES = ("shrink", "spares", "respawn")
_WAKE_TAG = 7501  # an active tells an idle spare: the job is done, or this active crashed
_RELEASE, _CRASHED = 1, 2
_INFO = 3  # ints per member in the assignment allgather: slot, world size, step ledger


class SparePool:
    """Every live process of the job (actives and idle spares), and which of them are active.

    Attributes:
        comm: ftcomm.Communicator over the pool (all live processes, MPI_COMM_WORLD order).
        active_world: MPI_COMM_WORLD ranks of the active ranks.
        events: one dict per recovery round this process took part in (for logs and tests).
    """

    def __init__(self, comm, active_world, timeout: float):
        self.comm, self.active_world, self.timeout = comm, set(active_world), timeout
        self.events: list[dict] = []
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
                value, source = self.comm._core.wait_signal(_WAKE_TAG, -1.0)
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
                self.comm._core.signal(peer, _WAKE_TAG, _CRASHED if crashed else _RELEASE, timeout)
            except FtError:
                pass  # that spare is gone; others still get theirs
        if not crashed:
            _fence_stuck(self.comm.world_ranks[p] for p in idle)

    # -- the round, run by everyone in the pool ---------------------------------------------------
    def rebuild_pool(self, slot: int, size: int, ledger: int):
        """Steps 2-6 of the module docstring, repeated until one round completes everywhere.
        Returns the new active Communicator, or None on a spare that stays idle."""
        t0 = time.perf_counter()
        while True:
            pool = self.comm.recover(timeout=self.timeout, policy="shrink")  # the pool is revoked
            try:
                active, event = assemble(pool, slot, size, ledger, self.timeout, "spares")
                ok = 1
            except FtError:
                active, event, ok = None, None, 0
            if pool.agree(ok, timeout=self.timeout):
                break
            self.comm = pool
            if not pool.is_revoked:
                pool.revoke()
        self.comm = pool
        event["seconds"] = time.perf_counter() - t0
        self.active_world = set(event["active_world"])
        self.events.append(event)
        return active


def _fence_stuck(world_ranks, wait_s: float = 3.0, silent_s: float = 1.0) -> None:
    """After the release: a spare that is still running ``wait_s`` later and has been silent for
    ``silent_s`` is stuck (stopped, or hung), and would keep the job from ending: SIGKILL it
    (on this host; core/liveness.h). A live idle spare beats every few milliseconds."""
    from . import _C

    pending = list(world_ranks)
    end = time.monotonic() + wait_s
    while pending and time.monotonic() < end:
        pending = [w for w in pending if not _C.liveness_finished(w)]
        time.sleep(0.01)
    if pending:
        _C.fence_silent(pending, silent_s)


def assemble(group, slot: int, size: int, ledger: int, timeout: float, policy: str):
    """Steps 3-5 over ``group`` (the shrunk pool, or the merge of survivors and respawned
    processes): returns (the new active Communicator or None, the event dict, which is also the
    Communicator's ``recovery``, with ``policy``). Every member computes the same event from the
    same allgather.

    Raises:
        ProcFailedError etc.: a member failed (a local outcome: the caller agrees and retries).
    """
    from .communicator import Communicator

    mine = np.array([slot, size, ledger], np.int64)
    table = np.empty(group.size * _INFO, np.int64)
    group.allgather(mine, table, timeout=timeout)
    table = table.reshape(group.size, _INFO)
    event = dict(plan(table, list(group.world_ranks)), policy=policy)
    color = -1 if group.rank not in event["new_rank_of_member"] else 0
    key = event["new_rank_of_member"].get(group.rank, 0)
    core = group._core.split(color, key, timeout)
    if core is None:
        return None, event
    core.last_committed_step = event["ledger"]
    active = Communicator(_core=core)
    active.promoted, active.recovery, active.old_to_new = slot < 0, event, event["old_to_new"]
    return active, event


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

    from . import nodes
    from .communicator import Communicator

    world_size = MPI.COMM_WORLD.Get_size()
    if not 0 <= spares < world_size:
        raise InvalidInputError(f"FTCOMM_SPARES={spares}: need 0 <= spares < {world_size} processes")
    pool_comm = Communicator(MPI.COMM_WORLD, timeout=timeout)
    nodes.register(pool_comm, timeout)  # newcomers must know every rank's node (buddy placement)
    n_active = world_size - spares
    _pool = SparePool(pool_comm, range(n_active), timeout)
    me = pool_comm.rank
    core = pool_comm._core.split(0 if me < n_active else -1, me, timeout)
    if core is None:
        return _pool.wait_for_promotion()
    active = Communicator(_core=core)
    active.promoted = False
    return active


def release_at_exit(crashed: bool = False) -> None:
    """Called at exit by every process: an active releases the idle spares (see ``release``)."""
    if _pool is not None:
        try:
            _pool.release(crashed)
        except Exception:  # noqa: BLE001  (exit path: never raise)
            pass


# -- Communicator.recover entry points ------------------------------------------------------------
def recover_with_spares(old, timeout: float):
    """``old.recover(policy="spares")`` (see there)."""
    p = _pool
    if p is None or not p.idle_spares:
        reason = "no spare pool (start the job with ftcomm-run --spares S)" if p is None else "spares exhausted"
        return _shrink_instead("spares", old._shrink_to_survivors(timeout), reason)
    if not old.is_revoked:
        old.revoke()  # peers still blocked on the failed communicator leave it
    new = p.refill(old)
    _finish_recovery(old, new, "spares")
    return new


def recover_with_respawn(old, shrunk, timeout: float):
    """``old.recover(policy="respawn")``: ``shrunk`` is the survivors' communicator."""
    missing = old.size - shrunk.size
    supported, why_not = respawn_supported()
    if not supported:
        return _shrink_instead("respawn", shrunk, why_not)
    t0 = time.perf_counter()
    try:
        merged = _spawn_and_merge(shrunk, missing, timeout)
        active, event = assemble(merged, old.rank, old.size, old.last_committed_step, timeout, "respawn")
        if not merged.agree(1, timeout=timeout):
            raise ProcFailedError("respawn: a process failed while joining")
    except FtError as error:
        return _shrink_instead("respawn", shrunk, f"respawn failed: {error}")
    event["seconds"] = time.perf_counter() - t0
    _finish_recovery(old, active, "respawn")
    return active


def _shrink_instead(policy: str, shrunk, reason: str):
    """The fallback of a policy that cannot bring newcomers: the survivors' communicator, with
    the reason logged and kept in ``recovery["fallback"]``."""
    log.warning("recover(policy=%r): %s; shrinking instead", policy, reason)
    shrunk.recovery = {"policy": "shrink", "fallback": reason, "new_size": shrunk.size}
    return shrunk


def _finish_recovery(old, new, policy: str) -> None:
    from . import _runtime

    event = new.recovery
    lost = sorted(set(old.world_ranks) - set(new.world_ranks))
    _runtime.record_lost(lost)
    if event.get("unfilled"):
        log.warning("recover(policy=%r): spares exhausted, %d failed rank(s) not replaced; world size "
                    "%d -> %d", policy, len(event["unfilled"]), old.size, new.size)
        event["fallback"] = "spares exhausted"


# -- respawn ----------------------------------------------------------------------------------------
def respawn_supported() -> tuple[bool, str]:
    """(whether ``policy="respawn"`` tries MPI_Comm_spawn, the reason if not). Refused on Open MPI
    5.0.x, where the spawn, merge and the collectives that follow do work, but the job's end does
    not: MPI_Finalize across the spawned job hangs or crashes in about one run in four (the
    parents' disconnect reaches the new processes through a TCP endpoint Open MPI never set up),
    so the launcher reports an abnormal end. Respawned processes also have no rank in the
    parents' MPI_COMM_WORLD (``world_ranks`` -1), which the sharded optimizer's layout and the
    hang fencing need. Evidence: docs/SPARES.md. FTCOMM_RESPAWN=force tries it anyway."""
    from mpi4py import MPI

    if os.environ.get("FTCOMM_RESPAWN") == "force":
        return True, ""
    version = MPI.Get_library_version()
    if "Open MPI v5.0." in version:
        return False, ("MPI_Comm_spawn is unreliable in Open MPI 5.0.x (MPI_Finalize across the spawned "
                       "job hangs or crashes), see docs/SPARES.md; FTCOMM_RESPAWN=force tries it")
    return True, ""


def spawned() -> bool:
    """True in a process started by ``recover(policy="respawn")`` (it has a parent)."""
    from mpi4py import MPI

    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def _spawn_and_merge(shrunk, count: int, timeout: float):
    """Starts ``count`` processes running this program (MPI_Comm_spawn, collective over
    ``shrunk``, root 0) and returns the ftcomm Communicator over survivors + newcomers (merged,
    survivors first). Spawn and merge cannot be interrupted: past ``timeout`` the watchdog kills
    this rank. Raises MpiError when MPI reports a failure."""
    from mpi4py import MPI

    from . import _C
    from .communicator import Communicator
    from .errors import MpiError

    info = MPI.Info.Create()
    info.Set("host", MPI.Get_processor_name())  # Open MPI: else "all slots already filled"
    token = _C.watchdog_arm(timeout, "MPI_Comm_spawn", False)
    try:
        parent = shrunk.mpi_comm
        inter = parent.Spawn(sys.executable, args=list(sys.orig_argv[1:]), maxprocs=count, info=info, root=0)
        merged = inter.Merge(high=False)
    except MPI.Exception as error:
        raise MpiError(f"MPI_Comm_spawn/merge: {error.Get_error_string()}") from error
    finally:
        _C.watchdog_disarm(token)
        info.Free()
    return Communicator(merged, timeout=timeout)


def join_respawn(timeout: float):
    """``ftcomm.world()`` in a respawned process: merges with the survivors and takes a failed
    rank's place. Returns the active Communicator (``promoted`` True)."""
    from mpi4py import MPI

    from .communicator import Communicator

    merged = Communicator(MPI.Comm.Get_parent().Merge(high=True), timeout=timeout)
    active, _ = assemble(merged, -1, 0, -1, timeout, "respawn")
    if not merged.agree(1, timeout=timeout):
        raise ProcFailedError("respawn: a process failed while joining")
    return active
