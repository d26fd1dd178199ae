"""ShardedOptimizer: ZeRO stage 1 over an ftcomm.Communicator, with in-memory buddy replicas.

ZeRO stage 1 (Rajbhandari et al., SC'20): every rank keeps the full parameters (data parallel),
but the optimizer state is partitioned: rank i owns shard i of the flattened fp32 parameters and
of every optimizer-state tensor (see ftcomm/training/layout.py). One training step is

    1. gradient allreduce of the flat gradient (plus a few statistics, in the same bucket), through
       the commit protocol (uniform ProcFailedError on a failure, buffers untouched);
    2. shard update, out of place: the new shard goes to a staging buffer, the committed one stays;
    3. allgather of the new parameter shards into the model's flat parameters;
    4. replication of the new shard to k buddies (ftcomm/training/replica.py, double-buffered);
    5. one agreement: either every survivor commits the step (staging -> live, pending replicas ->
       committed) or every survivor aborts it (nothing committed, the step is redone after
       ``rebuild``). That makes the step atomic, in the spirit of Horovod elastic's
       State.commit / restore.

On a failure the caller shrinks the communicator (``comm.recover()``) and calls ``rebuild``, which
finds every lost shard in a buddy's replica, verifies its checksum, re-shards the state over the
new world size, re-replicates and agrees (ftcomm/training/rebuild.py). No disk I/O on that path.

State on a device. By default the shard is updated in host memory by torch's CPU kernels. Given a
``device`` (``ftcomm.torch.zero.device_shard.DeviceShard`` for a model on a GPU), the live shard also
has a copy in device memory that torch's device kernels update; step 2 then runs on the device
and its result is copied into the host ``staging`` shard (parameters first, for the allgather,
then the state slots, for the replicas, overlapping the allgather). The host arrays stay the
committed state that replication, rebuild, scrub and state dicts work on; the device copy
follows them (``adopt``) after a rebuild or a load. The device object's interface:
``gather_grads(layout, rank)``, ``update(stepper, staging, start, scalars) -> scalars``,
``wait_params()``, ``wait_state()``, ``committed()``, ``adopt(live)``, and for a data plane that
moves device memory (its ``takes`` says so for the device ``staging``), ``gather_buffer(flat)``
and ``gathered_to_host(flat)``: step 3 then runs there, device to device.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..core import fault
from ..core.events import CorruptionEvent
from ..core.outcome import agreed, redone_on_corruption, retrying
from ..errors import CollectiveTimeoutError, FtError, ProcFailedError, RevokedError, UlfmUnavailableError
from ..membership import nodes
from . import rebuild as _rebuild
from . import scrub, storage
from .layout import ShardLayout
from .node_memory import NodeMemory
from .replica import ReplicaStore, checksum, encode_header
from .stepper import GroupRange, ShardStepper, resolve

_F32 = np.float32


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


class _PhaseClock:
    """Seconds spent in each phase of a step (``phases``), for logs and the MTTR benchmark."""

    def __init__(self):
        self.phases, self.last = {}, time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self.last
        self.last = now


def _param_groups(params) -> list[dict]:
    """``params`` as torch optimizers take it (tensors, or dicts of param groups) -> a list of
    group dicts, each with a list under "params"."""
    params = list(params)
    if params and isinstance(params[0], dict):
        return [dict(g, params=list(g["params"])) for g in params]
    return [{"params": params}]


def _group_ranges(groups: list[dict]) -> list[GroupRange]:
    """Each group's flat range (groups are laid out one after the other) and settings."""
    out, start = [], 0
    for g in groups:
        end = start + sum(p.numel() for p in g["params"])
        out.append(GroupRange(start, end, {k: v for k, v in g.items() if k != "params"}))
        start = end
    return out


class ShardedOptimizer:
    """ZeRO-1 sharded optimizer whose shards survive rank failures through buddy replicas.

    Args:
        params: the model's parameters, or a list of param groups (dicts with "params" and the
            group's settings) as torch optimizers take them: float32 CPU tensors that require
            grad, identical on every rank (rank 0's values are broadcast at construction). They
            are re-pointed into one flat float32 buffer, group after group, so that the
            allgather writes the model in place.
        comm: the Communicator.
        optimizer: a ``torch.optim.Optimizer`` class whose update is elementwise (SGD, Adam,
            AdamW, Adagrad, RMSprop, ...; checked, see ``stepper.py``), or "adamw" (AdamW) or
            "sgd" (SGD with momentum 0.9 unless given). torch's kernels do the math on each shard.
        lr: learning rate (default: the class's).
        replicas: k, number of buddies holding each shard (default 1; capped at size - 1).
        grad_op: "sum" (default; the loss must then be the sum over local samples divided by the
            global batch size, which stays exact when a shrink leaves uneven local batches) or
            "avg" (equal local batches only).
        timeout: deadline in seconds for each collective, default FTCOMM_TIMEOUT.
        data_plane: what moves a step's parameter allgather (3. above): an object with
            ``takes(tensors)``, ``allgather(comm, src, dst, timeout)`` and ``abort()``, such as
            the torch backend's inner gloo or NCCL group (``ftcomm/torch/group/data_plane.py``),
            which allgathers on the device when it takes the ``device``'s tensors; None
            (default): the communicator's ring. The step's agreement over ``comm`` commits it either way.
        **defaults: the optimizer class's other arguments (betas, weight_decay, momentum, ...).

    Memory per rank (bytes): full params 4P + flat grads 4P + live and staging shards
    2 x 4 x slots x P/N + replicas 2 x k x 4 x slots x P/N (committed + in flight); the shard
    buffers are allocated N/(N-1) times that, so that a shrink finds the memory of its larger
    shards already there (``storage.py``).

    On a newcomer (``comm.promoted``: a spare or respawned process that ``comm.recover`` put in a
    failed rank's place) the constructor does not start from ``params``: it joins the
    survivors' ``rebuild(comm)`` and receives the committed state (its shard from the buddies'
    replicas, the parameters from everyone, the replaced rank's metadata in ``committed_meta``);
    ``join_report`` then holds the rebuild report. ``newcomer=True`` makes an optimizer that
    holds nothing without joining: its caller runs ``rebuild(comm)`` with the survivors (the torch
    backend's hand-over does, inside its own retry loop).

    ``device``: where the shard is updated, if not in host memory (see the module docstring);
    with it, ``apply_gradients`` takes the gradients from the device and ``step`` is unavailable.

    Raises:
        ValueError: parameters that are not float32 CPU tensors requiring grad, or an optimizer
            that cannot be sharded elementwise (LBFGS, Adafactor, ...), naming it.
        ProcFailedError etc.: a rank failed during the initial broadcast or replication (on a
            newcomer: during the join; recover again and build the optimizer again).
    """

    def __init__(self, params, comm, optimizer="adamw", lr: float | None = None, replicas: int = 1,
                 grad_op: str = "sum", timeout: float | None = None, newcomer: bool = False, device=None,
                 data_plane=None, **defaults):
        groups = _param_groups(params)
        self.params = [p for g in groups for p in g["params"]]
        for i, p in enumerate(self.params):
            if p.dtype != torch.float32 or p.device.type != "cpu" or not p.requires_grad:
                raise ValueError(f"ShardedOptimizer takes float32 CPU parameters that require grad; parameter "
                                 f"{i} is {p.dtype} on {p.device}, requires_grad={p.requires_grad}")
        self.comm, self.timeout, self.grad_op = comm, timeout, grad_op
        self.data_plane = data_plane
        cls, kwargs = resolve(optimizer, defaults if lr is None else {**defaults, "lr": lr})
        self.stepper = ShardStepper(cls, kwargs, _group_ranges(groups))
        self.scalars: list | None = None  # per group, the committed step's scalars (None: no step yet)
        # Node-local shared memory for the shards and replicas (under ftcomm-run, on CPU): what a
        # relaunched job resumes from (``node_memory.py``, ``warm_resume.py``).
        self.memory = NodeMemory.for_rank(comm.world_rank) if device is None else None
        self.store = ReplicaStore(replicas, self.memory)
        self.step_id = 0  # last committed training step; 0 = the initial state
        self.committed_meta: dict = {}  # caller's metadata (data position, RNG) at step_id
        self.last_bytes_replicated = 0
        self.join_report = None
        self.phase: str | None = None  # the phase of step() running, for recovery events
        self.failure_seen_time: float | None = None  # when this rank last saw a failure in a step
        self.device = device  # None: the shard is updated in host memory
        # Memory for the buffers a device's copies touch (live, staging, flat parameters): its own
        # (page-locked) if it has one, else plain numpy memory.
        self.host_zeros = getattr(device, "host_zeros", None)
        self.shard_zeros = self.memory.zeros if self.memory is not None else self.host_zeros  # live, staging
        # what takes a reused shard buffer's memory before it grows into it (storage.reuse_or_allocate)
        self.shard_reserve = self.memory.reserve if self.memory is not None else None
        if newcomer or getattr(comm, "promoted", False):
            self.layout = None  # holds nothing until the rebuild adopts its state
            if not newcomer:
                self._join(comm)
            return
        numel = sum(p.numel() for p in self.params)
        nodes.register(comm, timeout)  # replicas go to other nodes than their owners
        self.layout = ShardLayout(numel, tuple(comm.world_ranks))
        flat = storage.allocate((self.layout.padded,), storage.flat_capacity(self.layout), self.host_zeros)
        self._copy_params_into(flat)
        comm.broadcast(flat, 0, timeout=timeout)
        self._bind(flat)
        self.live = storage.allocate(self.shard_shape(self.layout), self.shard_capacity(self.layout), self.shard_zeros)
        self.live[0] = self._my_slice(self.flat)
        self.staging = storage.allocate(self.live.shape, self.shard_capacity(self.layout), self.shard_zeros)
        self._replicate_and_agree(step=0, meta={})
        self._follow_on_device()

    # -- layout helpers ------------------------------------------------------------------
    @property
    def replicas(self) -> int:
        return self.store.replicas

    @property
    def numel(self) -> int:
        return self.layout.numel

    def shard_shape(self, layout: ShardLayout) -> tuple:
        """Shape of a shard's state under ``layout``: (slots, shard_len)."""
        return len(self.stepper.slots), layout.shard_len

    def shard_capacity(self, layout: ShardLayout) -> int:
        """Elements to allocate for a shard buffer under ``layout`` (``storage.py``)."""
        return storage.shard_capacity(layout, len(self.stepper.slots))

    def _my_slice(self, flat: np.ndarray) -> np.ndarray:
        start = self.layout.start(self.comm.rank)
        return flat[start:start + self.layout.shard_len]

    def _copy_params_into(self, flat: np.ndarray) -> None:
        offset = 0
        for p in self.params:
            flat[offset:offset + p.numel()] = p.detach().reshape(-1).numpy()
            offset += p.numel()

    def _bind(self, flat: np.ndarray) -> None:
        """Points every parameter into ``flat`` (views, no copy) and gives the flat gradient the
        same length, in the memory it had if that is large enough (no flat gradient when the
        shard is updated on a device: its gradients stay there)."""
        grad = None
        if self.device is None:
            grad = storage.reuse(getattr(self, "flat_grad", None), flat.shape)
            if grad is None:
                grad = storage.allocate(flat.shape, storage.storage(flat).size)
            grad[self.layout.numel:] = 0  # padding: never written by _gather_grads
        self.flat, self.flat_grad = flat, grad
        offset = 0
        for p in self.params:
            p.data = _t(flat[offset:offset + p.numel()]).view_as(p)
            offset += p.numel()

    def _gather_grads(self) -> None:
        offset = 0
        for p in self.params:
            view = self.flat_grad[offset:offset + p.numel()]
            if p.grad is None:
                view[:] = 0
            else:
                _t(view).copy_(p.grad.reshape(-1))
            offset += p.numel()

    def zero_grad(self) -> None:
        """Sets every parameter's ``.grad`` to None."""
        for p in self.params:
            p.grad = None

    # -- the atomic step -----------------------------------------------------------------
    def step(self, stats=None, meta: dict | None = None) -> np.ndarray:
        """Applies one training step atomically (see the module docstring).

        Args:
            stats: float64 values summed over ranks in the gradient bucket (e.g. loss sum, sample
                count); default none.
            meta: JSON-serialisable metadata committed with the step and copied into the replicas
                (the elastic driver puts the data position and RNG state here).

        Returns:
            The summed ``stats`` (float64 array).

        Raises:
            ProcFailedError, RevokedError, CollectiveTimeoutError: the step did not commit on any
                survivor; the live shard, replicas and ``step_id`` are as before the call, the
                model's parameters may be half-updated (``rebuild`` restores them). Call
                ``comm.recover()`` then ``rebuild(new_comm)`` and redo the step.
        """
        if self.device is not None:
            raise RuntimeError("ShardedOptimizer.step: the shard is updated on a device, whose gradients DDP "
                               "averages; call apply_gradients()")
        clock = self._start_step()
        summed = np.array(list(stats or []) or [0.0], np.float64)
        self.phase = "allreduce"
        redone_on_corruption(lambda: self.comm.allreduce([self.flat_grad, summed], op=self.grad_op,
                                                         timeout=self.timeout), "gradient allreduce")
        clock.mark("allreduce")
        self._commit_step(meta, clock)
        return summed[: len(list(stats or []))]

    def apply_gradients(self, meta: dict | None = None) -> None:
        """Applies one training step atomically with the gradients the parameters hold, which must
        already be the global ones, equal on every rank (DDP averaged them in backward). A
        parameter whose ``.grad`` is None counts as a zero gradient. With a ``device``, the
        gradients are those of the device parameters it was given.

        Raises:
            As ``step`` (without its allreduce). An error of this rank's own that is not an
            ``FtError`` (out of device memory, a kernel torch refuses) is raised as it is, after
            the step's agreement voided the step on every rank (the others raise
            ProcFailedError; nothing was committed anywhere).
        """
        clock = self._start_step()
        self._commit_step(meta, clock)

    def _start_step(self) -> _PhaseClock:
        self.failure_seen_time = None
        clock = _PhaseClock()
        self.timing, self.last_phase_start = clock.phases, clock.last
        if self.device is None:
            self._gather_grads()
        else:
            self.device.gather_grads(self.layout, self.comm.rank)
        return clock

    def _commit_step(self, meta: dict | None, clock: _PhaseClock) -> None:
        """Update, allgather, replication and the agreement that commits or voids the step."""
        step = self.step_id + 1
        self.phase = "update, allgather, replication"
        local_error = None
        try:
            with agreed(self.comm, f"step {step} (update, allgather, replication)", step=step,
                        timeout=self.timeout, on_abort=self.store.discard_pending) as outcome:
                try:
                    self._update_gather_replicate(step, meta or {}, clock)
                except FtError:
                    raise
                except Exception as error:  # noqa: BLE001 - e.g. out of device memory: not a hang for the peers
                    local_error = error
                    self._revoke_for_peers()
                    outcome.fail(error)
        except ProcFailedError:
            if local_error is not None:
                raise local_error  # the step is voided on every rank; this rank says why
            raise
        finally:
            clock.mark("agree")  # the agreement's time, also when it aborted the step
        self.live, self.staging = self.staging, self.live
        if self.device is not None:
            self.device.committed()
        self._commit_holdings(step, self._staging_header)
        self.scalars = self._staging_scalars
        self.step_id, self.committed_meta, self.phase = step, dict(meta or {}), None

    def _update_gather_replicate(self, step: int, meta: dict, clock) -> None:
        """Steps 2-4 of the module docstring, into ``staging`` and the pending replicas. A local
        failure raises (the step's agreement then aborts the step on every rank)."""
        try:
            fault.point("shard_update", self.comm.world_rank, step)
            self._staging_scalars = self._update_shard()
            clock.mark("update")
            fault.point("param_allgather", self.comm.world_rank, step)
            self._allgather_params()
            clock.mark("allgather")
            fault.point("replicate", self.comm.world_rank, step)
            if self.device is not None:
                self.device.wait_state()  # the state slots' (and gathered parameters') copies
            header = encode_header(self.replica_meta(step, meta, scalars=self._staging_scalars), self.staging)
            self._staging_header = header
            self.last_bytes_replicated = self.store.replicate(self.comm, header, self.staging, self.flat,
                                                             self.timeout)
            clock.mark("replicate")
        except FtError:
            clock.mark("failed")
            self.failure_seen_time = time.time()  # wall clock, before the step's agreement
            raise
        finally:
            self.last_phase_start = clock.last
            if self.device is not None:
                self.device.wait_state()  # no copy into ``staging`` may outlive the step (a rebuild reuses it)

    def _allgather_params(self) -> None:
        """Every rank's new parameter shard into the model's flat parameters, uncommitted: from
        the device staging shard into the device's buffer when the data plane moves device memory
        (``device_shard.py``; the host flat parameters follow on the side stream), else from the
        host staging shard."""
        if self._gathers_on_device():
            gathered = self.device.gather_buffer(self.flat)
            self.data_plane.allgather(self.comm, self.device.staging[0], gathered, self.timeout)
            self.device.gathered_to_host(self.flat)
            return
        if self.device is not None:
            self.device.wait_params()  # the new parameters' copy to the host
        if self.data_plane is None:
            self.comm.allgather(self.staging[0], self.flat, timeout=self.timeout)
        else:
            self.data_plane.allgather(self.comm, self.staging[0], self.flat, self.timeout)

    def _gathers_on_device(self) -> bool:
        return self.device is not None and self.data_plane is not None and self.data_plane.takes([self.device.staging])

    def _revoke_for_peers(self) -> None:
        """Revokes the communicator (and aborts the data plane) so that peers waiting on this rank
        (in the allgather or the replication) leave their waits for the step's agreement.
        Without ULFM there is nothing to revoke: such a job ends on the error anyway."""
        if self.data_plane is not None:
            self.data_plane.abort()
        try:
            self.comm.revoke()
        except UlfmUnavailableError:
            pass

    def _update_shard(self) -> list:
        """Step 2 into ``staging`` (on the device, then copied to ``staging``, if there is one);
        returns the new scalars."""
        start = self.layout.start(self.comm.rank)
        if self.memory is not None:
            self.memory.unmark(self.staging)  # the step writes it: not a committed state until it commits
        if self.device is not None:
            return self.device.update(self.stepper, self.staging, start, self.scalars)
        return self.stepper.update(self.live, self._my_slice(self.flat_grad), self.staging, start, self.scalars)

    def _follow_on_device(self) -> None:
        """The device copy of the live shard takes the host one (after it changed other than by a
        step: construction, a rebuild, a load)."""
        if self.device is not None:
            self.device.adopt(self.live)

    def replica_meta(self, step: int, meta: dict, comm=None, layout: ShardLayout | None = None,
                     scalars=None) -> dict:
        """The header of this rank's replica at ``step`` (``meta``: the caller's committed
        metadata; ``scalars``: the step's, default the committed ones); ``comm`` and ``layout``
        default to the current ones (a rebuild passes the new ones). It carries what a relaunch
        needs to re-shard the copy (``warm_resume.py``): the layout's size and the slots."""
        comm, layout = comm or self.comm, layout or self.layout
        return {"shard": comm.rank, "step": step, "world_rank": comm.world_rank,
                "numel": layout.numel, "shard_len": layout.shard_len, "size": layout.size,
                "slots": len(self.stepper.slots), "optimizer": self.stepper.name,
                "engine": self.memory.engine if self.memory is not None else 0,
                "scalars": self.scalars if scalars is None else scalars, "extra": meta}

    def _commit_holdings(self, step: int, header) -> None:
        """After the agreement on ``step``: the pending replicas become the committed ones, and
        in node memory they and the live shard (replicated with ``header``) are marked as
        holding committed ``step``."""
        self.store.commit(step)
        if self.memory is not None:
            self.memory.mark(self.live, step, header)

    def _replicate_and_agree(self, step: int, meta: dict) -> int:
        """Replicates the live shard tagged with ``step`` and commits the replicas if every rank
        succeeded; raises ProcFailedError otherwise. Returns bytes sent."""
        sent = 0
        with agreed(self.comm, f"replication of step {step}", step=step, timeout=self.timeout,
                    on_abort=self.store.discard_pending):
            header = encode_header(self.replica_meta(step, meta), self.live)
            sent = self.store.replicate(self.comm, header, self.live, self.flat, self.timeout)
        self._commit_holdings(step, header)
        return sent

    def load_state(self, slots: dict, scalars: list | None) -> None:
        """Replaces the committed optimizer state by a whole one (a loaded state dict), keeping
        the parameters and the step. Collective: each rank takes its shard, replicates, agrees.

        Args:
            slots: {slot name: float32 array of ``numel``} for every state slot but "param";
                a missing slot is zero (state not created yet).
            scalars: per group, {name: float} or None (that group has taken no step yet).

        Raises:
            ProcFailedError etc.: a rank failed; nothing changed.
        """
        lo, hi = self.layout.bounds(self.comm.rank)
        self.load_shard({name: values[lo:hi] for name, values in slots.items()}, scalars, self.step_id,
                        self.committed_meta)

    def load_shard(self, slots: dict, scalars: list | None, step: int, meta: dict, ok: bool = True,
                   comm=None) -> None:
        """Makes a loaded state the committed one over ``comm`` (default the current
        communicator; another one after a failure, the layout then follows it): this rank's shard
        of each state slot, the parameters as they are now (loaded into the model), at committed
        ``step`` with ``meta``. Collective: the parameters' allgather, each rank replicates its
        shard, one agreement (``rebuild.finish``).

        Args:
            slots: {slot name: float32 array of this rank's shard's real elements under the
                layout over ``comm`` (``ShardLayout.bounds``)} for the state slots (not "param");
                a missing slot is zero.
            scalars: per group, {name: float} or None.
            ok: False when this rank could not load its part: every rank then raises.

        Raises:
            ProcFailedError etc.: a rank failed or could not load; nothing changed.
        """
        comm = comm or self.comm
        layout = ShardLayout(self.numel, tuple(comm.world_ranks))
        lo, hi = layout.bounds(comm.rank)
        live = storage.allocate(self.shard_shape(layout), self.shard_capacity(layout), self.shard_zeros)
        self.scalars = scalars  # what the new replicas' headers carry
        if ok:
            params = np.concatenate([p.detach().reshape(-1).cpu().numpy() for p in self.params])
            live[0, : hi - lo] = params[lo:hi]
            for i, name in enumerate(self.stepper.slots[1:], start=1):
                if name in slots:
                    live[i, : hi - lo] = slots[name]
        _rebuild.finish(self, comm, layout, live, step, meta, ok)
        self.scalars = scalars

    # -- recovery ------------------------------------------------------------------------
    def rebuild(self, comm) -> dict:
        """Restores the state of the last committed step over the shrunk communicator ``comm``:
        finds each shard with its owner or a buddy's replica (checksum verified), re-shards over
        ``comm.size`` ranks, allgathers the parameters, re-replicates, agrees.

        Returns:
            A report: ``bytes_moved`` (whole job, re-shard traffic), ``sources`` (old shard ->
            old rank used), ``from_replica`` (shards taken from a buddy), ``rebuild_s``, and
            ``phases``: seconds of ``share_s`` (newcomers learn the old layout), ``verify_s``
            (sources chosen, replicas' checksums agreed), ``move_s`` (the re-shard exchange),
            ``finish_s`` (of it ``allgather_s`` of the parameters and ``replicate_s`` to the new
            buddies, then the agreement).

        Raises:
            StateLostError: a shard has no surviving, valid copy (uniform on every survivor);
                ``lost_shards`` names it (old shard ids = old ranks). Nothing was changed.
            ProcFailedError etc.: another failure during the rebuild; nothing was changed:
                recover again and call ``rebuild`` once more.
        """
        t0 = time.perf_counter()
        result = _rebuild.rebuild_in_memory(self, comm)
        result["rebuild_s"] = time.perf_counter() - t0
        return result

    def old_state_summary(self) -> dict:
        """What a newcomer learns before a rebuild (``rebuild.share_old_state``): layout, step,
        committed metadata and scalars, replicas and optimizer class, JSON-serialisable."""
        return {"numel": self.layout.numel, "world_ranks": list(self.layout.world_ranks), "step": self.step_id,
                "meta": self.committed_meta, "scalars": self.scalars, "replicas": self.replicas,
                "optimizer": self.stepper.name}

    def _join(self, comm, max_attempts: int = 8) -> None:
        """A newcomer's start: the survivors' rebuild, repeated (with them) after a failure."""
        policy = comm.recovery.policy if comm.recovery is not None else "spares"
        self.comm = comm

        def recover_again(_error) -> None:
            self.comm = self.comm.recover(timeout=self.timeout, policy=policy)
            self.comm.promoted = True  # still a newcomer: it holds no state yet

        # StateLostError and bad input are the same on every rank: they end the join.
        retry_on = (ProcFailedError, RevokedError, CollectiveTimeoutError)
        for attempt in retrying(max_attempts, retry_on=retry_on, on_failure=recover_again):
            with attempt:
                self.join_report = self.rebuild(self.comm)

    def adopt(self, comm, layout: ShardLayout, live: np.ndarray, flat: np.ndarray, step: int,
              meta: dict, header: np.ndarray | None = None) -> None:
        """Makes a rebuilt state current (``rebuild.finish`` calls it after its agreement, on
        every rank): the new communicator, layout, live shard and parameters, step and metadata;
        the pending replicas become the committed ones; ``header`` is the one the new live shard
        was replicated with."""
        old_live = getattr(self, "live", None)  # a newcomer has none
        self.comm, self.layout, self.live = comm, layout, live
        if self.memory is not None and old_live is not None:
            self.memory.unmark(old_live)  # reused as staging, or dropped
        self.staging = storage.reuse_or_allocate(old_live, live.shape, self.shard_capacity(layout), self.shard_zeros,
                                                 self.shard_reserve)
        self._bind(flat)
        self._commit_holdings(step, header)
        self.step_id, self.committed_meta = step, dict(meta)
        self._follow_on_device()

    def live_is_valid(self) -> bool:
        """Whether this rank's live shard still hashes to what its buddies received with the last
        committed replicas (True when nothing was replicated yet)."""
        digest = self.store.own_digest
        return digest is None or checksum(self.live) == digest

    def check_state(self) -> CorruptionEvent | None:
        """Scrubs the sharded state for silent corruption at rest (``scrub.py``): every rank's live
        shard against the checksum it replicated, every replica against its header; a bad copy
        anywhere makes every rank rebuild the committed state from good copies. Collective.

        Returns:
            The event (also in ``ftcomm.corruptions()``), or None when everything was intact.

        Raises:
            StateLostError: a shard has no intact copy left.
            ProcFailedError etc.: a rank failed during the check; recover and rebuild as after a
                failed step (the committed state is unchanged).
        """
        return scrub.check_state(self)

    def gather_state(self) -> dict:
        """Every slot of the full (unsharded) committed state, for tests and checkpoints:
        ``{slot: float32 array of numel}``. Collective (allgather per slot)."""
        out = {}
        for i, name in enumerate(self.stepper.slots):
            full = np.empty(self.layout.padded, _F32)
            self.comm.allgather(self.live[i], full, timeout=self.timeout)
            out[name] = full[: self.layout.numel].copy()
        return out

    @property
    def shard_bytes(self) -> int:
        """Bytes of this rank's live shard (all slots)."""
        return int(self.live.nbytes)
