"""ftcomm.Communicator: a fault-tolerant communicator over an mpi4py communicator.

The recovery verbs follow the ULFM chapter of the MPI Forum draft (mpi-forum/mpi-issues#20):
revoke (MPIX_Comm_revoke), shrink (MPIX_Comm_shrink), agree (MPIX_Comm_agree), failure ack
(MPIX_Comm_ack_failed / MPIX_Comm_get_failed). They are called from the C++ core, never through
mpi4py, whose fallbacks are not fault tolerant. Every blocking call has a deadline: the
``timeout`` argument, else FTCOMM_TIMEOUT (default 60 s).
"""
from __future__ import annotations

import zlib

import numpy as np

from . import _buffers, _C, _runtime, config
from .dtypes import op_code
from .errors import InvalidInputError, ProcFailedError, UlfmUnavailableError

_ULFM_HINT = (
    "MPI runs without ULFM. Launch with `ftcomm-run -n N ...` (Open MPI: mpirun --with-ft ulfm); "
    "see mpi_configs/README.md."
)


def _timeout(timeout):
    value = config.default_timeout() if timeout is None else float(timeout)
    if not value > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return value


class Communicator:
    """A communicator whose collectives survive rank failures.

    Args:
        comm: an ``mpi4py.MPI.Comm`` (intra-communicator); default ``MPI.COMM_WORLD``. It is
            duplicated, so ftcomm's traffic and error handler never touch the caller's.
        timeout: deadline in seconds for the duplication (collective over ``comm``).

    Raises:
        ProcFailedError: a rank died while the communicator was created.
        CollectiveTimeoutError: a rank did not join within ``timeout``.
    """

    def __init__(self, comm=None, *, timeout: float | None = None, _core=None):
        if _core is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD if comm is None else comm
            _core = _C.Communicator.create(comm, _timeout(timeout))
        self._core = _core
        self.old_to_new: list[int] | None = None  # set on a communicator made by shrink/recover
        self.promoted = False  # True on a spare or respawned process that joined by recover()
        self.recovery: dict | None = None  # what recover() did (policy, promoted ranks, fallback)
        self._mpi_comm = None

    # -- identity ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the communicator (0 .. size-1)."""
        return self._core.rank

    @property
    def size(self) -> int:
        """Number of ranks (the world size of this communicator)."""
        return self._core.size

    @property
    def world_ranks(self) -> list[int]:
        """MPI_COMM_WORLD rank of each rank of this communicator."""
        return list(self._core.world_ranks)

    @property
    def world_rank(self) -> int:
        """This process's MPI_COMM_WORLD rank (stable across shrinks)."""
        return self._core.world_ranks[self._core.rank]

    @property
    def ft_enabled(self) -> bool:
        """True when MPI runs with ULFM on (the MPIX_FT attribute of MPI_COMM_WORLD)."""
        return self._core.ft_enabled

    @property
    def mpi_comm(self):
        """An mpi4py communicator for the same MPI communicator (for baselines and debugging;
        traffic on it is not fault tolerant)."""
        if self._mpi_comm is None:
            self._mpi_comm = self._core.mpi_comm()
        return self._mpi_comm

    @property
    def last_committed_step(self) -> int:
        """Step id of the last committed collective (-1 before the first)."""
        return self._core.last_committed_step

    def __repr__(self) -> str:
        return f"<ftcomm.Communicator rank {self.rank} of {self.size}, last committed step {self.last_committed_step}>"

    # -- ULFM verbs ----------------------------------------------------------------------
    def _require_ft(self, verb: str) -> None:
        if not self.ft_enabled:
            raise UlfmUnavailableError(f"{verb}: {_ULFM_HINT}")

    def revoke(self) -> None:
        """Revokes the communicator: every pending and later operation on it fails with
        RevokedError on every rank. Local, returns at once.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("revoke")
        self._core.revoke()

    @property
    def is_revoked(self) -> bool:
        """True once any rank revoked the communicator and this rank learned of it."""
        return self._core.is_revoked

    def failed_ranks(self) -> list[int]:
        """Acknowledges the failures this rank knows of and returns the failed ranks, sorted, in
        this communicator's numbering. Local: other ranks may know more or less.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("failed_ranks")
        return list(self._core.failed_ranks())

    def agree(self, flag: int, timeout: float | None = None) -> int:
        """Bitwise AND of ``flag`` (a non-negative int below 2**31) over the live ranks; every live
        rank gets the same value, even when a rank dies during the call (its contribution is
        then left out). Without ULFM it is an allreduce and assumes nobody fails.

        Raises:
            InvalidInputError (a ValueError): ``flag`` is not an int in [0, 2**31). Raised on this
                rank before any communication (an agreement has no room to carry the reason to
                the others, who then wait for this rank as for any late one).
            CollectiveTimeoutError: no agreement within ``timeout`` seconds.
            RevokedError, ProcFailedError: only if failures keep arriving during the call.
        """
        if isinstance(flag, bool) or not isinstance(flag, (int, np.integer)) or not 0 <= flag < 2**31:
            raise InvalidInputError(f"agree: flag must be an int in [0, 2**31), not {flag!r}")
        value, _saw_failure = self._core.agree(int(flag), _timeout(timeout))
        return value

    def barrier(self, timeout: float | None = None) -> None:
        """Blocks until every rank arrives.

        Raises:
            ProcFailedError, RevokedError: a rank failed or the communicator was revoked.
            CollectiveTimeoutError: not every rank arrived within ``timeout`` seconds.
        """
        self._core.barrier(_timeout(timeout))

    def shrink(self, timeout: float | None = None) -> "Communicator":
        """A new communicator over the live ranks, ranks consecutive and in the old order
        (MPIX_Comm_shrink). Collective over the survivors. ``result.old_to_new[r]`` is the new rank
        of old rank r, -1 for a failed one. MPI cannot interrupt a shrink: past ``timeout`` the
        watchdog kills this rank, so that a stuck rank cannot hold the others forever.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
        """
        self._require_ft("shrink")
        core, old_to_new = self._core.shrink(_timeout(timeout))
        return self._adopt(core, old_to_new)

    def recover(self, timeout: float | None = None, policy: str | None = None) -> "Communicator":
        """After a failed collective, the communicator on which to go on (collective over the
        survivors; with spares or respawn, over the newcomers too).

        Args:
            timeout: deadline in seconds for each phase.
            policy: ``"shrink"`` (default; FTCOMM_RECOVERY_POLICY changes the default): revoke (if
                not yet revoked) and shrink to the survivors, ranks consecutive in the old order;
                if the failed collective already shrank (it does, to agree on the failed ranks),
                that communicator. ``"spares"``: an idle spare (``ftcomm-run --spares S``) takes
                each failed rank's place, so the size and every survivor's rank stay as they were;
                when the spares run out the remaining places are closed as shrink does (logged,
                ``recovery["unfilled"]``). ``"respawn"``: new processes are started with
                MPI_Comm_spawn instead of spares; if spawning fails, shrink (logged). Newcomers
                have ``promoted`` True. ``result.recovery`` says what was done; ``result.old_to_new``
                maps old ranks to new ones (-1: failed and not replaced). Protocols: ftcomm/spares.py.

        Raises:
            UlfmUnavailableError: MPI runs without ULFM.
            InvalidInputError (a ValueError): unknown policy.
        """
        policy = config.recovery_policy() if policy is None else policy
        if policy not in _POLICIES:
            raise InvalidInputError(f"recover: policy must be one of {_POLICIES}, not {policy!r}")
        self._require_ft("recover")
        if policy == "spares":
            from . import spares

            return spares.recover_with_spares(self, _timeout(timeout))
        shrunk = self._shrink_to_survivors(timeout)
        if policy == "respawn":
            from . import spares

            return spares.recover_with_respawn(self, shrunk, _timeout(timeout))
        shrunk.recovery = {"policy": "shrink", "new_size": shrunk.size}
        return shrunk

    def _shrink_to_survivors(self, timeout) -> "Communicator":
        if self._core.has_recovered:
            core, old_to_new = self._core.take_recovered()
            return self._adopt(core, old_to_new)
        if not self._core.is_revoked:
            self._core.revoke()
        return self.shrink(timeout)

    def _adopt(self, core, old_to_new) -> "Communicator":
        new = Communicator(_core=core)
        new.old_to_new = list(old_to_new)
        _runtime.record_lost(w for w, n in zip(self.world_ranks, old_to_new) if n < 0)
        return new

    # -- collectives ---------------------------------------------------------------------
    def allreduce(self, buffers, op: str = "sum", step: int | None = None,
                  timeout: float | None = None, chunk_bytes: int | None = None) -> int:
        """Fault-aware ring allreduce, in place, committed as one step.

        Args:
            buffers: a contiguous, writable numpy array or torch CPU tensor, or a list of them
                (a bucket reduced as one step). Or CUDA buffers (torch CUDA tensors, CuPy arrays,
                ``__cuda_array_interface__`` objects), all on one device, never mixed with host
                buffers in one step: staged through pinned host memory, written only on commit,
                ordered on the producer's current stream (docs/GPU.md). dtypes: float32, float64, float16, bfloat16 (each
                operation in float32, rounded back), int32, int64 (wrapping). Any length.
            op: "sum", "avg", "min", "max" or "prod". avg on integers truncates toward zero.
            step: the step id; default last committed + 1. A step equal to the last committed one
                is a replay: a no-op, no communication, the buffer keeps the committed result.
                A step below it, or different between ranks, is an error on every rank.
            timeout: deadline in seconds for the whole step.
            chunk_bytes: pipelining chunk of the ring, bytes (default FTCOMM_CHUNK_BYTES, 1 MiB).

        Returns:
            The step id committed (or replayed).

        Raises:
            InvalidInputError: on every rank, when any rank passed a bad buffer, op or step, or
                ranks disagree on lengths or dtypes. No buffer was touched.
            ProcFailedError: a rank died. Every survivor raises it with the same ``step`` and
                ``failed_ranks``, its buffers bitwise as before the call. ``recover()`` then gives
                the communicator on which to retry the step.
            RevokedError: the communicator was revoked (by a failure elsewhere); same rules.
            CollectiveTimeoutError: a peer stopped answering within ``timeout``.

        Algorithm: reduce-scatter then allgather around the ring (Patarasuk & Yuan, JPDC 2009),
        pipelined by chunk; commit by one ULFM agreement (docs/DESIGN.md).
        """
        bufs = _buffers.describe(buffers)
        code = op_code(op)
        problem = bufs.problem
        if code is None and problem == _buffers.NONE:
            problem = _buffers.UNSUPPORTED_OP
        if step is None:
            step = self.last_committed_step + 1
        if bufs.device is not None:  # issue #6: device buffers, staged through pinned host memory
            from . import cuda

            cuda._allreduce(self._core, bufs, code or 0, int(step), _timeout(timeout),
                            int(chunk_bytes or config.chunk_bytes()), problem)
            return int(step)
        replayed = self._core.allreduce(
            bufs.triples, code or 0, int(step), _timeout(timeout),
            int(chunk_bytes or config.chunk_bytes()), problem,
        )
        del replayed
        return int(step)

    # mpi4py-style capitalised alias for users who think in MPI names.
    Allreduce = allreduce

    def exchange(self, sends=(), recvs=(), tag: int = 0, timeout: float | None = None) -> None:
        """Point-to-point batch: every ``(peer, buffer)`` in ``sends`` is sent to ``peer`` and
        every one in ``recvs`` received from it (bytes; sizes must match the peer's), all posted
        at once and completed under one deadline. Local outcome: on failure the communicator is
        revoked so that peers waiting on this rank fail too; callers that need every rank to
        agree on the outcome follow it with ``agree``.

        Raises:
            ProcFailedError, RevokedError: a peer failed or the communicator was revoked.
            CollectiveTimeoutError: not complete within ``timeout`` seconds.
            InvalidInputError: a buffer is not contiguous host memory, or a peer rank is invalid.
        """
        # Checked here, before anything is posted: the core revokes the communicator on any error
        # once transfers are in flight, and a typo in a peer rank should not cost the communicator.
        for p, _ in (*sends, *recvs):
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= p < self.size:
                raise InvalidInputError(f"exchange: peer {p!r} is not a rank of the communicator (0..{self.size - 1})")
        send_list = [(int(p), *_buffers.raw(b, writable=False)) for p, b in sends]
        recv_list = [(int(p), *_buffers.raw(b, writable=True)) for p, b in recvs]
        _C.exchange(self._core, send_list, recv_list, int(tag), _timeout(timeout))

    def allgather(self, sendbuf, recvbuf, timeout: float | None = None) -> None:
        """Ring allgather: ``recvbuf`` (``size * len(sendbuf)`` elements, same dtype, contiguous)
        receives every rank's ``sendbuf`` in rank order. N-1 ring steps of one ``exchange`` each.

        Input is validated across ranks first (one small round of messages): a bad buffer on any
        rank, or sizes or dtypes that differ between ranks, raise the same InvalidInputError on
        every rank before any buffer is touched. Failures during the transfer are a local outcome,
        as for ``exchange``; ``timeout`` is in seconds, per phase.

        Raises:
            InvalidInputError: on every rank, as above.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``exchange`` (local).
        """
        n, r = self.size, self.rank
        problem, fields = 0, [0, 0, 0]
        try:
            send_bytes = _buffers.raw(sendbuf, writable=False)[1]
            recv_bytes = _buffers.raw(recvbuf, writable=True)[1]
            fields = [send_bytes, recv_bytes, _dtype_key(sendbuf)]
            if recv_bytes != n * send_bytes:
                problem = _RECV_SIZE
            elif _dtype_key(recvbuf) != _dtype_key(sendbuf):
                problem = _DTYPE_DIFFERS
        except InvalidInputError:
            problem = _NOT_A_BUFFER
        self._validate("allgather", problem, fields, ("sendbuf bytes", "recvbuf bytes", "dtypes"), timeout)
        blocks = _split_blocks(recvbuf, n)
        _copy_into(blocks[r], sendbuf)
        right, left = (r + 1) % n, (r - 1) % n
        for k in range(n - 1):
            self.exchange(sends=[(right, blocks[(r - k) % n])], recvs=[(left, blocks[(r - k - 1) % n])],
                          tag=_ALLGATHER_TAG, timeout=timeout)

    def broadcast(self, buf, root: int = 0, timeout: float | None = None) -> None:
        """Sends ``buf`` from ``root`` to every rank, in place (binomial tree). Input (``root``, the
        buffer's size and dtype) is validated across ranks first, as for ``allgather``; failures
        during the transfer are a local outcome, as ``exchange``. ``timeout`` in seconds, per phase.

        Raises:
            InvalidInputError: on every rank: a bad buffer or root on some rank, or roots, sizes or
                dtypes that differ between ranks. ``buf`` untouched.
            ProcFailedError, RevokedError, CollectiveTimeoutError: as ``exchange`` (local).
        """
        n, r = self.size, self.rank
        problem, fields = 0, [0, 0, 0]
        try:
            fields = [_buffers.raw(buf, writable=True)[1], _dtype_key(buf), 0]
            if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
                problem = _BAD_ROOT
            else:
                fields[2] = int(root)
                if not 0 <= root < n:
                    problem = _BAD_ROOT
        except InvalidInputError:
            problem = _NOT_A_BUFFER
        self._validate("broadcast", problem, fields, ("buffer bytes", "dtypes", "roots"), timeout)
        rel = (r - root) % n
        mask = 1
        while mask < n:  # receive from the parent
            if rel & mask:
                self.exchange(recvs=[((r - mask) % n, buf)], tag=_BROADCAST_TAG, timeout=timeout)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:  # send to the children
            if rel + mask < n and not rel & mask:
                self.exchange(sends=[((r + mask) % n, buf)], tag=_BROADCAST_TAG, timeout=timeout)
            mask >>= 1

    def broadcast_bytes(self, data: bytes | None, root: int = 0, timeout: float | None = None) -> bytes:
        """``data`` (given on ``root``; None elsewhere) on every rank, of any length: its length
        (one int64) is broadcast first, then its bytes. ``timeout`` in seconds, per phase.

        Returns:
            The root's bytes.
        Raises:
            As ``broadcast`` (InvalidInputError on every rank for a bad root; ProcFailedError,
            RevokedError, CollectiveTimeoutError as a local outcome).
        """
        length = np.array([0 if data is None else len(data)], np.int64)
        self.broadcast(length, root, timeout=timeout)
        buf = np.frombuffer(data, np.uint8).copy() if data is not None else np.zeros(int(length[0]), np.uint8)
        self.broadcast(buf, root, timeout=timeout)
        return buf.tobytes()

    def _validate(self, what: str, problem: int, fields, names, timeout) -> None:
        """Uniform input check of a collective helper: every rank brings its own problem code (0 =
        none) and the values that must be equal everywhere; one min/max round gives every rank the
        same view, hence the same InvalidInputError (or none)."""
        values = [problem, self.rank if problem else -1, *[int(f) for f in fields]]
        mins, maxs = _C.minmax(self._core, values, _timeout(timeout))
        if maxs[0]:
            raise InvalidInputError(f"{what}: rank {maxs[1]} passed bad input: {_PROBLEMS[maxs[0]]}")
        for i, name in enumerate(names):
            if mins[2 + i] != maxs[2 + i]:
                values = "" if name == "dtypes" else f" (from {mins[2 + i]} to {maxs[2 + i]})"
                raise InvalidInputError(f"{what}: ranks passed different {name}{values}")


_POLICIES = ("shrink", "spares", "respawn")
_ALLGATHER_TAG = 7101
_BROADCAST_TAG = 7102

# Problem codes of the helpers' uniform validation (the highest code wins the message).
_NOT_A_BUFFER, _RECV_SIZE, _DTYPE_DIFFERS, _BAD_ROOT = 1, 2, 3, 4
_PROBLEMS = {
    _NOT_A_BUFFER: "a buffer is not a contiguous (writable) numpy array or CPU tensor",
    _RECV_SIZE: "recvbuf does not hold size x sendbuf bytes",
    _DTYPE_DIFFERS: "sendbuf and recvbuf dtypes differ",
    _BAD_ROOT: "root is not a rank of the communicator",
}


def _dtype_key(buf) -> int:
    """A small stable integer naming a buffer's dtype, compared across ranks."""
    return zlib.crc32(str(getattr(buf, "dtype", type(buf).__name__)).replace("torch.", "").encode()) & 0x7FFFFFFF


def _split_blocks(buf, n):
    flat = buf.reshape(-1)
    if flat.shape[0] % n:
        raise InvalidInputError(f"allgather: recvbuf length {flat.shape[0]} is not a multiple of size {n}")
    per = flat.shape[0] // n
    return [flat[i * per:(i + 1) * per] for i in range(n)]


def _copy_into(dst, src) -> None:
    dst[...] = src.reshape(-1) if hasattr(src, "reshape") else src


def world(timeout: float | None = None) -> Communicator:
    """A Communicator over MPI_COMM_WORLD, or, with spares (``ftcomm-run --spares S``, which sets
    FTCOMM_SPARES), over the active ranks: on an idle spare this call returns only once the spare
    is promoted into a failed rank's place (``promoted`` True), and ends the process with status 0
    when the job finishes without it. In a process started by ``recover(policy="respawn")`` it
    joins the survivors and returns with ``promoted`` True. See ftcomm/spares.py.

    Raises:
        ProcFailedError: a rank died during the set-up (or, on a spare, every active rank died).
        CollectiveTimeoutError: a rank did not join within ``timeout`` seconds.
    """
    from . import spares

    timeout = _timeout(timeout)
    if spares.spawned():
        return spares.join_respawn(timeout)
    if config.spares() > 0:
        return spares.start(config.spares(), timeout)
    return Communicator(timeout=timeout)


__all__ = ["Communicator", "world", "ProcFailedError"]
