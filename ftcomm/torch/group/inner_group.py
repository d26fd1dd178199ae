"""An inner torch process group as a data plane: what the gloo and NCCL planes share.

The inner group spans the ranks of the ftcomm communicator it was made for, in the same order, and
is made anew for each new communicator (after every recovery). It meets through a ``TCPStore``
that the communicator's rank 0 serves, under a key prefix of its own (``group_store.py``: the store
is kept while rank 0 stays, and made anew on a free port when rank 0 was lost), so a group can be
made again whoever died, with no fixed master, and no key of an old group can be mistaken for a
new one's.

The control plane, not the transport, decides when a collective has failed. The calling thread
(ftcomm's communication thread) starts the collective and watches it until it ends (``_run``).
``start_allreduce`` splits the two: it starts an allreduce from the caller's own thread (backward's,
for a gradient bucket: no hand-over to the communication thread on the bucket's path, as with a
plain torch backend) and leaves the watch (``Started.watch``) to the communication thread. The
watch gives up on a collective when

- the transport failed it (gloo: a peer's connection closed; NCCL: an error reported by NCCL);
- a peer on this host that was alive when the group was made has exited or was fenced (ftcomm-run's
  liveness table: NCCL between processes of one host does not notice a dead peer);
- a peer has been silent past ``FTCOMM_FENCE_TIMEOUT``: it is stopped, and is fenced (SIGKILL);
- another member gave up on the group: it wrote the store's abort key, or its rank 0 (the store's
  server) is gone or stopped (``abort_watch.py`` looks from a thread of its own: a stopped server
  never answers);
- this rank's ``abort()`` was called, from any thread;
- the deadline passed.

Giving up writes the abort key, so that every member gives up on the group too: torch's rule that
once one rank aborts a communicator every rank must abort it. The group is then aborted on this
rank (``_abort_group``) and dropped, and the failure is raised as ``ProcFailedError``; the step's
agreement over the communicator voids the step on every rank, the communicator recovers, and the
next collective makes a new inner group.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time

import torch
import torch.distributed as dist

from ...core import fault, liveness
from ...errors import FtError, ProcFailedError
from .abort_watch import ABORT_KEY, AbortWatch
from .device import is_device
from .group_store import GroupStores
from .lifetime import release_in_background
from .plane_mismatch import naming_the_plane

# "avg" is a sum, divided by the size afterwards (gloo has no AVG).
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}
_LOOK_EVERY = 0.1      # seconds between two looks at the liveness table and the store while waiting
_STORE_ANSWER = 5.0    # seconds the store may take to answer a look; past it, rank 0 counts as gone


class InnerGroupPlane:
    """A data plane that moves tensors through an inner torch process group (see the module).

    Subclasses say how to make the group (``_make_group``), which tensors it takes as they are
    (``takes``), how to start its collectives and wait a little for them (``_start_allreduce``,
    ``_start_allgather``, ``_ended_within``), and how to abort it (``_abort_group``).

    Attributes:
        groups_made: inner groups made so far (1 + the recoveries that needed one).
        stores_made: rendezvous stores this rank connected to for them (``group_store.py``: 1 +
            the recoveries that lost rank 0).
        completed: collectives that completed here, by name ("allreduce", "allgather").
    """

    name = "inner"
    first_pause = 20e-6   # seconds of the first wait for a collective, doubled up to longest_pause,
    longest_pause = 5e-3  # between two looks at the clock

    def __init__(self):
        self._lock = threading.Lock()  # the group's state: abort() may come from another thread
        self._comm = None
        self._group = None
        self._stores = GroupStores()  # where the groups meet, kept from one to the next
        self._store = None  # the current group's view of it: its rendezvous and abort key
        self._watch: AbortWatch | None = None  # looks for the abort key (abort_watch.py)
        self._local_peers: list[int] = []  # world ranks alive on this host when the group was made
        self._aborted = threading.Event()  # abort() was called on this rank for the current group
        self.groups_made = 0
        self.completed: collections.Counter = collections.Counter()

    @property
    def stores_made(self) -> int:
        return self._stores.stores_made

    # -- what the process group calls (data_plane.py) ------------------------------------------
    def takes(self, tensors) -> bool:
        """Whether this plane moves ``tensors`` as they are, with no copy (else the caller stages
        them): host tensors, or device tensors all on one device."""
        return not any(is_device(t) for t in tensors) or on_one_device(tensors)

    def fault_point(self, tensors) -> str:
        """The ``ftcomm.fault`` point inside an allreduce of ``tensors`` (fault injection): just
        before this rank starts its part in the inner group."""
        return "data_plane"

    def allreduce(self, comm, tensors, op: str, timeout) -> int:
        """Reduces ``tensors`` in place over ``comm``'s ranks (several: as one bucket, each reduced on
        its own), uncommitted. Returns the step id it is recorded under
        (``Communicator.reserve_uncommitted_step``).

        Raises:
            ProcFailedError: the inner group could not be made or its collective failed (see the
                module); the inner group is aborted on every rank.
            FtError: the communicator failed while the group was being made.
        """
        step = comm.reserve_uncommitted_step()
        self._collective(comm, timeout, step, "allreduce",
                         lambda group: self._start_allreduce(group, tensors, op, timeout),
                         point=self.fault_point(tensors),
                         device=tensors[0].device if tensors else None)
        finish_avg(op, tensors, comm.size)
        return step

    def allgather(self, comm, src, dst, timeout) -> None:
        """Gathers every rank's contiguous 1-D ``src`` (the same length and dtype on every rank)
        into the contiguous 1-D ``dst`` of ``comm.size * len(src)`` elements, in rank order,
        uncommitted: the caller's agreement commits it (ZeRO's parameter allgather). ``src`` and
        ``dst``: numpy arrays, or torch tensors this plane ``takes`` (on one device: no copy).

        Raises:
            ProcFailedError, FtError: as ``allreduce``; ``dst`` is then undefined.
        """
        inp, out = _as_tensor(src), _as_tensor(dst)
        self._collective(comm, timeout, comm.last_committed_step + 1, "allgather",
                         lambda group: [self._start_allgather(group, out, inp, timeout)],
                         device=inp.device if is_device(inp) else None)

    def starts_inline(self, tensors) -> bool:
        """Whether ``start_allreduce`` may start an allreduce of ``tensors`` from the caller's
        thread: host tensors (a CUDA tensor's completion would need its streams' order kept)."""
        return bool(tensors) and not any(is_device(t) for t in tensors)

    def start_allreduce(self, comm, tensors, op: str, timeout) -> "Started | None":
        """``allreduce`` without the communication thread: starts the allreduce of ``tensors`` now,
        from the caller's thread, uncommitted, and returns it (``Started``: its step id, a callback
        at its completion, and its watch, which is to run on the communication thread). None where
        it cannot start here: the caller then queues ``allreduce``. It cannot when the inner group
        for ``comm`` is not made yet (making it broadcasts over ``comm``, which only the
        communication thread may call), or ``starts_inline`` says no.

        The caller must have nothing of this plane or ``comm`` queued before it (so that the start
        order on the inner group, and the step id, are the program's on every rank).
        """
        if not self.starts_inline(tensors):
            return None
        with self._lock:
            if self._comm is not comm or self._group is None:
                return None
            group, watch = self._group, self._watch
        step = comm.reserve_uncommitted_step()
        fault.point(self.fault_point(tensors), comm.world_rank, step)
        started = time.monotonic()
        try:
            works, failure = self._start_allreduce(group, tensors, op, timeout), None
        except RuntimeError as error:
            works, failure = [], str(error)
        return Started(self, comm, step, works, failure, op, tensors, float(timeout), started, watch)

    def abort(self) -> None:
        """Ends this rank's part in the inner group after a local error (any thread): the other
        members give up on it now instead of at the deadline."""
        self._aborted.set()
        with self._lock:
            self._abort_locked()

    # -- for subclasses --------------------------------------------------------------------------
    def _make_group(self, store, rank: int, size: int, timeout: float, device):
        """The inner group over ``store``; ``device``: the torch device of the first collective's
        tensors (the communication thread's current device is not the caller's)."""
        raise NotImplementedError

    def _start_allreduce(self, group, tensors, op: str, timeout) -> list:
        """Starts the allreduce of ``tensors`` on ``group``; returns its works."""
        raise NotImplementedError

    def _start_allgather(self, group, out, inp, timeout):
        """Starts the allgather of the 1-D ``inp`` into the 1-D ``out`` on ``group``; returns its work."""
        raise NotImplementedError

    def _ended_within(self, work, seconds: float) -> bool:
        """Whether ``work`` ended (well or not), waiting at most ``seconds``."""
        raise NotImplementedError

    def _abort_group(self, group) -> None:
        """Ends this rank's side of ``group`` so that nothing of it waits any more."""
        raise NotImplementedError

    # -- machinery -------------------------------------------------------------------------------
    def _collective(self, comm, timeout, step: int, name: str, start, point: str | None = None,
                    device=None) -> None:
        """Runs ``start(group)``'s collective on the inner group for ``comm`` and watches it; on
        failure aborts the group and raises ``ProcFailedError`` at ``step``."""
        group = self._group_for(comm, timeout, device)
        if point:
            fault.point(point, comm.world_rank, step)
        failure = self._run(group, start, comm, name, step, float(timeout))
        # Nothing may keep the group alive on failure (not even a traceback's frame): the last
        # reference must be the one _outcome releases on a thread of its own (release_in_background),
        # or gloo's destructor would run here, waiting for a collective stuck on a stopped peer.
        group = None  # noqa: F841
        error = self._outcome(comm, name, step, failure)
        if error is not None:
            raise error

    def _outcome(self, comm, name: str, step: int, failure: str | None) -> ProcFailedError | None:
        """Counts a collective that completed; aborts the group after one that failed
        (``failure``: why) and returns its error."""
        if failure is None:
            self.completed[name] += 1
            return None
        self.abort()
        return ProcFailedError(f"{self.name} data plane: {name} failed on world rank {comm.world_rank}: {failure}",
                               step=step)

    def _run(self, group, start, comm, name: str, step: int, deadline_s: float) -> str | None:
        """Starts the collective and watches it (see the module). None when it succeeded, else why
        not, in words (a string: an exception would keep this frame, and with it the group, alive)."""
        started = time.monotonic()
        try:
            works = start(group)
        except RuntimeError as error:
            return str(error)
        return self._watch_works(works, comm, name, step, deadline_s, started, self._watch)

    def _watch_works(self, works, comm, name: str, step: int, deadline_s: float, started: float,
                     watch: AbortWatch) -> str | None:
        """Waits for ``works`` (the collective ``name`` of ``step``, started at ``started``,
        ``time.monotonic()``) until they end or the control plane gives up on them: ``_run``'s
        verdict. A wait that takes a while is published in the liveness table, as the core's own
        waits are, so that a peer whose deadline passes sees this rank waiting with it."""
        with contextlib.ExitStack() as published:
            def publish() -> None:  # at the first look: in the liveness table, and the store's looks
                published.enter_context(liveness.in_call(name, step))
                watch.looking(True)

            try:
                return self._wait(works, comm, deadline_s, started, watch, publish)
            finally:
                watch.looking(False)

    def _wait(self, works, comm, deadline_s: float, started: float, watch: AbortWatch, publish) -> str | None:
        """``_watch_works``'s loop; ``publish()`` is called once, at the first look."""
        fence_after = liveness.fence_timeout()
        peers = [w for w in comm.world_ranks if w != comm.world_rank]
        next_look, looked = started + _LOOK_EVERY, False
        pause = self.first_pause
        try:
            for work in works:
                while not self._ended_within(work, pause):
                    pause = min(2 * pause, self.longest_pause)
                    if self._aborted.is_set():
                        return "this rank aborted the group"
                    now = time.monotonic()
                    if now - started >= deadline_s:
                        return _deadline_passed(peers, deadline_s)
                    if now >= next_look:  # only for a collective that takes a while
                        if not looked:
                            publish()
                            looked = True
                        liveness.beat()
                        why = self._look_around(peers, watch, fence_after if now - started >= fence_after else None)
                        if why:
                            return why
                        next_look = now + _LOOK_EVERY
                work.wait()  # its error, if it failed
        except RuntimeError as error:
            return str(error)
        return None

    def _look_around(self, peers, watch: AbortWatch, fence_after: float | None) -> str | None:
        """Why the collective cannot end any more, or None: a local peer gone, another member's
        abort, the store gone (``watch``; never blocks). Past ``fence_after`` seconds, fences the
        peers on this host silent that long."""
        if fence_after is not None:
            liveness.fence_silent(peers, fence_after)
        gone = [w for w in self._local_peers if liveness.finished(w)]
        if gone:
            return f"world rank(s) {gone} on this host exited or were fenced"
        return watch.verdict()

    def _group_for(self, comm, timeout, device):
        with self._lock:
            if self._comm is comm and self._group is not None:
                return self._group
            self._drop_locked()
            self._aborted.clear()
        try:
            with naming_the_plane(self.name, comm):  # the ring's ranks call an allreduce here
                store, watch_store = self._stores.for_group(comm, float(timeout), _STORE_ANSWER)
            # Alive on this host now: the peers whose exit this rank will see (liveness.finished is
            # also true for peers on other hosts, which the transport or the store must report).
            local_peers = [w for w in comm.world_ranks if w != comm.world_rank and not liveness.finished(w)]
            group = self._make_group(store, comm.rank, comm.size, float(timeout), device)
            watch = AbortWatch(watch_store, _LOOK_EVERY, _STORE_ANSWER)
        except FtError:
            raise
        except RuntimeError as error:  # a peer died between the broadcast and the rendezvous
            raise ProcFailedError(f"{self.name} data plane: no inner group over {comm.size} ranks: {error}",
                                  step=comm.last_committed_step + 1) from error
        with self._lock:
            self._comm, self._group, self._store, self._local_peers = comm, group, store, local_peers
            self._watch = watch
            self.groups_made += 1
        return group

    def _abort_locked(self) -> None:
        if self._store is not None:
            _write_abort_key(self._store)
        if self._group is not None:
            try:
                self._abort_group(self._group)
            except RuntimeError:
                pass  # already broken: dropping it is all that is left
        self._drop_locked(aborted=True)

    def _drop_locked(self, aborted: bool = False) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._group is not None and not aborted:
            self._abort_group(self._group)  # torch's rule: a group left behind is aborted, not destroyed
        last_references = [self._group, self._store]
        self._comm = self._group = self._store = self._watch = None
        self._local_peers = []
        # gloo's destructor waits for a collective still waiting on a stopped peer (lifetime.py)
        release_in_background(last_references, "inner-group")


class Started:
    """An allreduce that ``InnerGroupPlane.start_allreduce`` started from the caller's thread.

    Attributes:
        step: the step id it is recorded under (``Communicator.reserve_uncommitted_step``).
    """

    def __init__(self, plane, comm, step, works, failure, op, tensors, timeout, started, watch):
        self.step = step
        self._plane, self._comm, self._works, self._failure = plane, comm, works, failure
        self._op, self._tensors, self._timeout, self._started, self._watch = op, tensors, timeout, started, watch

    def on_success(self, callback) -> None:
        """Calls ``callback()`` once the allreduce completed well (on the transport's thread, or
        at once if it already has), after the division of "avg"; never after a failure, which
        ``watch`` reports."""
        if self._failure is not None:
            return
        works = self._works
        many = len(works) > 1  # the callback keeps no work (nor its group's connections) alive
        done = torch.futures.collect_all([w.get_future() for w in works]) if many else works[0].get_future()
        del works

        def completed(future) -> None:
            # Never Work.wait() here: a work is marked done only after its future's callbacks ran.
            try:
                for f in (future.value() if many else [future]):
                    f.value()  # raises the transport's error
            except Exception:  # noqa: BLE001 - any error is the watch's to report
                return
            finish_avg(self._op, self._tensors, self._comm.size)
            callback()

        done.add_done_callback(completed)

    def watch(self) -> ProcFailedError | None:
        """Waits until the allreduce ends or the control plane gives up on it (see the module);
        on the communication thread. Returns its error, after aborting the group on every member;
        None when it completed."""
        failure = self._failure
        if failure is None:
            failure = self._plane._watch_works(self._works, self._comm, "allreduce", self.step, self._timeout,
                                               self._started, self._watch)
        self._works = None  # nothing of the group may outlive a failure here (see _collective)
        return self._plane._outcome(self._comm, "allreduce", self.step, failure)


def _write_abort_key(store) -> None:
    """Writes the abort key into ``store`` from a thread of its own, on this rank's rendezvous
    client (not the watch's, which may be stuck): a store whose server, the group's rank 0, is
    stopped never answers, and ``set`` then blocks for the store's whole timeout; the rank that
    gives up must go on to the step's agreement at once."""
    def write() -> None:
        try:
            store.set(ABORT_KEY, "1")
        except RuntimeError:
            pass  # the store's server is gone: the others see that as an abort too

    threading.Thread(target=write, name="ftcomm-abort-key", daemon=True).start()


def _deadline_passed(peers, deadline_s: float) -> str:
    """Why a collective gave up at its deadline, after judging the peers on this host that kept it
    waiting (``liveness.judge``): a hung or late one is fenced now, as by the core's own waits, so
    that the step's agreement that follows finds a dead process at once instead of waiting for it
    through a second deadline."""
    _, why = liveness.judge(peers)
    return f"timeout after {deadline_s:g} s" + (f": {why}" if why else "")


def finish_avg(op: str, tensors, size: int) -> None:
    """After a reduction done as a sum for "avg" (``REDUCE_OPS``): divides ``tensors`` by ``size``."""
    if op == "avg":
        for t in tensors:
            t.div_(size)


def _as_tensor(a):
    """A torch view of a numpy array (a tensor as it is)."""
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(a.reshape(-1))


def on_one_device(tensors) -> bool:
    """Whether ``tensors`` are device tensors, at least one, all on the same device."""
    return bool(tensors) and all(is_device(t) for t in tensors) and len({t.device for t in tensors}) == 1

