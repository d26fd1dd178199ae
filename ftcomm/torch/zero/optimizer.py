"""``ZeroRedundancyOptimizer``: torch's ZeRO-1 optimizer for DDP over the ftcomm backend, whose
shards survive the loss of ranks.

A stock DDP + ZeRO script changes its import, its backend name, this class and its loop::

    from ftcomm.torch import ZeroRedundancyOptimizer     # was torch.distributed.optim's
    dist.init_process_group("ftcomm")                    # was "gloo"
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW, lr=1e-3)
    for x, y in ftcomm.torch.resilient(loader, model=ddp, optimizer=opt): ...

The sharded state is ``ftcomm.training.ShardedOptimizer``'s (ZeRO stage 1, Rajbhandari et al.,
SC'20): each rank owns a contiguous slice of the flattened parameters and of every per-element
state tensor, updated by torch's own optimizer class (``training/stepper.py``), and keeps k
checksummed replicas of its buddies' slices in host memory. DDP has averaged the gradients in
backward, so every rank holds the global gradient when ``step()`` runs:

1. each rank updates its shard out of place (the committed one stays);
2. an allgather writes the new parameter shards into the model;
3. the new shard goes to its k buddies (pending replicas);
4. one agreement commits the step on every survivor, or voids it on every survivor.

A rank failure in backward (a DDP bucket's allreduce): the process group shrinks its communicator
and the step is voided (``step_state.py``); ``step()`` then rebuilds the shards over the
survivors from the owners and the buddies' replicas (the last committed step, bitwise) and
changes nothing else, and ``resilient`` redoes the step. A failure inside ``step()``: the
agreement voids the step on every survivor; ``step()`` recovers the group, rebuilds the same way
and the step is redone. A shard lost with all its replicas raises ``ftcomm.StateLostError`` on
every survivor (fall back to a disk checkpoint: ``consolidate_state_dict`` + ``torch.save``).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ...core.outcome import retrying
from ...errors import CollectiveTimeoutError, ProcFailedError, RevokedError
from ...training import ShardedOptimizer
from ...training import warm_resume
from ...training.stepper import probe, resolve
from ..group.executor import EXECUTOR
from ..group.process_group import ftcomm_group
from ..group.step_state import step_voided, void_current_step
from .device_shard import DeviceShard
from .host_master import HostMaster

_FAILURES = (ProcFailedError, RevokedError, CollectiveTimeoutError)


def _describe_groups(groups: list[dict]) -> str:
    """What must be equal on every rank: each group's parameter count, sizes, dtypes, device
    types (each rank has its own GPU index) and settings."""
    parts = []
    for g in groups:
        params = g["params"]
        settings = {k: v for k, v in sorted(g.items()) if k != "params"}
        parts.append(f"{len(params)} params of {sum(p.numel() for p in params)} elements "
                     f"({sorted({str(p.dtype) for p in params})}, {sorted({p.device.type for p in params})}, "
                     f"requires_grad {sorted({p.requires_grad for p in params})}, "
                     f"settings {settings})")
    return f"{len(groups)} param group(s): " + "; ".join(parts)


def group_settings(optimizer) -> list[dict]:
    """``optimizer``'s param groups' settings (lr after a scheduler, ...), without parameters:
    what a newcomer or a relaunch takes over (``take_group_settings``). Any torch optimizer."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def take_group_settings(optimizer, saved: list[dict]) -> None:
    """Sets ``optimizer``'s param groups' settings to ``saved`` (``group_settings``'s)."""
    for group, theirs in zip(optimizer.param_groups, saved):
        group.update(theirs)


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank keeps the optimizer state of one shard of the parameters, with k replicas
    of other ranks' shards (see the module docstring).

    Args:
        params: the DDP model's parameters, or param groups (dicts), as for any torch optimizer:
            float32 tensors that require grad, the same shapes and groups on every rank. On CPU
            the engine works on them in place. On a GPU (every parameter on one device) the
            shard's state lives in device memory and torch's device kernels update it, with its
            committed copy in page-locked host memory and the replicas in host memory
            (``device_shard.py``). The device parameters receive each committed step from host
            master copies (``host_master.py``), or, where the group's data plane moves device
            memory (``FTCOMM_DATA_PLANE=nccl``, or gloo), from the step's allgather on the device.
        optimizer_class: a ``torch.optim.Optimizer`` class whose update is elementwise (SGD,
            Adam, AdamW, Adagrad, RMSprop, NAdam, RAdam, Adamax, ASGD, Rprop, Adadelta).
        process_group: the ftcomm process group DDP uses (default: the default group).
        replicas: k, buddies holding a copy of each shard (default 1; capped at world size - 1).
            Memory per rank: the parameters and gradients, one flat float32 copy of each
            (4 x numel bytes), plus (1 + 1 + 2k) x (state slots + 1) x 4 x numel / (world size
            - 1) bytes for the live and staging shards and the committed and pending replicas
            (allocated with room for one shrink, ``ftcomm/training/storage.py``); with the state
            on a GPU, no flat gradient on the host, and (2 x (state slots + 1) + 1) x 4 x numel /
            (world size - 1) bytes of device memory for its live and staging shards and gradient.
        offload: True keeps the state of a GPU model's shard in host memory only and updates
            it there with torch's CPU kernels (ZeRO-Offload: less device memory, a slower step;
            the gradients go to the host whole). Always so for parameters spread over several
            devices or mixed with host ones.
        parameters_as_bucket_view, overlap_with_ddp: torch's; the parameters always live in one
            flat buffer here, and overlap with DDP is refused.
        **defaults: the optimizer class's arguments (lr, betas, weight_decay, momentum, ...).

    A parameter whose ``.grad`` is None at ``step()`` counts as a zero gradient (torch's
    optimizers skip it); ``state`` stays empty (the state is sharded; see ``state_dict``).

    Raises:
        ValueError: on every rank: an optimizer class that cannot be sharded elementwise (LBFGS,
            SparseAdam, Adafactor), param groups that differ between ranks (naming the world
            ranks and both descriptions), parameters that are not float32 CPU tensors requiring
            grad (CPU or CUDA), or ``overlap_with_ddp=True``.
        TypeError: the process group is not an ftcomm one.

    With spare ranks (``ftcomm-run --spares S``) a promoted spare builds this optimizer holding
    nothing; at the hand-over (``join.py``) it takes its shard from the buddy that kept the
    replaced rank's replica, the survivors keep theirs: one shard moves, not the whole state.
    """

    def __init__(self, params, optimizer_class, *, process_group=None, replicas: int = 1, offload: bool = False,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, **defaults):
        self._pg = ftcomm_group(process_group, "ftcomm.torch.ZeroRedundancyOptimizer")
        if overlap_with_ddp:
            raise ValueError("ftcomm.torch.ZeroRedundancyOptimizer: overlap_with_ddp=True is not supported; "
                             "the step runs after backward")
        cls, self._kwargs = resolve(optimizer_class, defaults)
        self.optimizer_class = cls
        self._engine = None  # built once torch's constructor has made the param groups
        self._master: HostMaster | None = None
        self._consolidated = None
        self._replicas = replicas
        self._offload = offload
        self.last_rebuild: dict | None = None
        self.last_recovery: dict | None = None
        super().__init__(params, probe(cls, self._kwargs).defaults)
        # A promoted spare's group runs no collective before the hand-over: it holds nothing yet.
        self._engine = self._new_engine(newcomer=True) if self._pg.joining else self._new_engine()

    # -- the sharded state -------------------------------------------------------------------
    def _new_engine(self, newcomer: bool = False) -> ShardedOptimizer:
        comm = self._pg.comm
        if not newcomer:
            comm.require_same("param groups", _describe_groups(self.param_groups), timeout=self._pg.timeout)
        self._master = HostMaster(self.param_groups)
        shard_on_device = None
        if self._master.one_device and not self._offload:
            shard_on_device = DeviceShard(self._master.device_params)
        engine = ShardedOptimizer(self._master.groups, comm, self.optimizer_class, replicas=self._replicas,
                                  timeout=self._pg.timeout, newcomer=newcomer, device=shard_on_device,
                                  data_plane=self._pg.data_plane, **self._kwargs)
        if not newcomer:
            self._master.params_to_device()  # rank 0's parameters, as the engine broadcast them
        return engine

    @property
    def sharded(self) -> ShardedOptimizer:
        """The sharded state underneath: ``layout``, ``live`` (this rank's shard, float32
        ``(slots, shard_len)``), ``store`` (replicas), ``step_id`` (steps committed),
        ``timing`` (seconds per phase of the last step)."""
        return self._engine

    def add_param_group(self, param_group: dict) -> None:
        """As torch's; after construction it is collective (every rank adds the same group): the
        state so far is gathered and laid out again with the new group at the end."""
        super().add_param_group(param_group)
        if self._engine is None:
            return
        full, scalars = self._engine.gather_state(), self._engine.scalars
        steps = self._engine.step_id
        self._engine = self._new_engine()
        self._engine.step_id = steps
        new_numel = self._engine.numel
        slots = {}
        for name in self._engine.stepper.slots[1:]:
            grown = np.zeros(new_numel, np.float32)
            grown[: full[name].size] = full[name]
            slots[name] = grown
        self._engine.load_state(slots, None if scalars is None else [*scalars, None])

    # -- the step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step on every rank's shard, committed or voided on every survivor.

        Returns:
            ``closure()``'s loss, if a closure is given.

        Raises:
            ProcFailedError, RevokedError, CollectiveTimeoutError: outside a ``resilient`` loop
                (after the group recovered and the shards were rebuilt; the step was not applied).
            StateLostError: a shard and all its replicas are lost.

        After a failure inside the step, ``last_recovery`` holds its timeline: ``detected_time``
        (wall clock, s), ``agree_s`` (the step's agreement), ``recover_s`` (the group's shrink or
        spare round), ``rebuild_s`` and ``bytes_moved`` (the shards' rebuild).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        EXECUTOR.drain()
        if step_voided():  # a failure in backward: the survivors' last committed step, re-sharded
            self._follow_group()
            return loss
        if self._engine.comm is not self._pg.comm:  # the group recovered outside a resilient loop
            self._follow_group()
        self._engine.stepper.set_hyper(self.param_groups)
        if self._engine.device is None:
            self._master.grads_to_host()  # else the shard's gradient is gathered on the device
        try:
            self._engine.apply_gradients()
        except _FAILURES as exc:
            self._recover_from(exc)
            # The device parameters are the rebuilt ones (_follow_group), or, while a spare is on
            # its way, still the last committed step's: the step wrote only the host copies.
            return loss
        shard = self._engine.device
        if shard is not None and shard.holds_committed_params:
            shard.params_from_gathered()  # the step allgathered them on the device
        else:
            self._master.params_to_device()  # committed, or the rebuilt last committed step
        return loss

    def _recover_from(self, exc) -> None:
        """A failure voided this step on every survivor: recover the group, rebuild the shards,
        and have ``resilient`` redo the step (or raise outside it). Records ``last_recovery``."""
        agreed_time = time.time()
        seen = self._engine.failure_seen_time or agreed_time
        redo = self._pg.recover_after(self._engine.comm, "ZeroRedundancyOptimizer.step", exc)
        recovered_time = time.time()
        self._follow_group()
        self.last_recovery = {"detected_time": seen, "agree_s": agreed_time - seen,
                              "recover_s": recovered_time - agreed_time, "rebuild_s": time.time() - recovered_time,
                              "bytes_moved": (self.last_rebuild or {}).get("bytes_moved", 0)}
        if not redo:
            raise exc
        void_current_step()

    def _follow_group(self) -> None:
        """Rebuilds the shards over the group's current communicator from owners and replicas,
        again after each further failure."""
        if self._pg.awaiting_join:
            return  # a spare is coming: the hand-over rebuilds with it (one shard moves, to it)
        attempted = [None]

        def recover_again(error) -> None:
            self._pg.recover_after(attempted[0], "ZeroRedundancyOptimizer rebuild", error)

        for attempt in retrying(None, retry_on=_FAILURES, on_failure=recover_again):
            with attempt:
                attempted[0] = self._pg.comm
                if self._engine.comm is not attempted[0]:
                    self.last_rebuild = self._engine.rebuild(attempted[0])
        self._master.params_to_device()

    # -- hand-over to a promoted spare (join.py) ----------------------------------------------
    def hand_over_settings(self) -> list[dict]:
        """The param groups' settings (lr after a scheduler, ...), without parameters or state."""
        return group_settings(self)

    def take_settings(self, settings: list[dict]) -> None:
        """A newcomer takes the survivors' ``hand_over_settings()``."""
        take_group_settings(self, settings)

    def hand_over_shards(self, comm) -> None:
        """Collective over the group's communicator in the hand-over: survivors and newcomers
        rebuild the shards over ``comm`` (a newcomer receives its shard from a buddy's replica,
        the parameters from everyone). On a failure nothing changed and it raises (the
        hand-over recovers and starts again)."""
        self._engine.stepper.set_hyper(self.param_groups)
        self.last_rebuild = self._engine.rebuild(comm)
        self._master.params_to_device()

    # -- warm restart from the nodes' shared memory (warm.py) ---------------------------------
    @property
    def node_memory(self):
        """The engine's node-local shared memory (``training/node_memory.py``), or None."""
        return self._engine.memory

    @property
    def committed_step(self) -> int:
        """The engine's last committed step."""
        return self._engine.step_id

    def resume_from_memory(self, comm, log=None, eligible=None, fetch=None) -> dict | None:
        """On a relaunch: the newest step the nodes' shared memory holds whole, re-sharded over
        ``comm`` and made current (``training/warm_resume.resume``, whose arguments and result
        these are), the parameters then copied into the model. Collective.

        Raises:
            ProcFailedError etc.: a rank failed; nothing changed.
        """
        found = warm_resume.resume(self._engine, comm, log, eligible=eligible, fetch=fetch)
        if found is not None:
            self._master.params_to_device()
        return found

    # -- disk checkpoints (checkpoint.py) -----------------------------------------------------
    def load_checkpoint(self, shard: dict, settings: list, step: int) -> None:
        """Makes a disk checkpoint's state current, collectively: the parameters as the model
        now holds them (loaded by the caller), this rank's shard of the state (``shard``, from
        ``training.checkpoint.sharded.read_optimizer``), the groups' ``settings``, committed at
        ``step``.

        Raises:
            ProcFailedError etc.: a rank failed; the state is as before.
        """
        self._master.params_from_device()
        self._engine.load_shard(shard["slots"], shard["scalars"], step, shard["meta"])
        self.take_settings(settings)
        self._master.params_to_device()

    # -- state dicts -------------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gathers the whole optimizer state for ``state_dict()`` on rank ``to``. Collective.

        Raises:
            ValueError: ``to`` is not a rank of the group (on every rank).
        """
        if not 0 <= to < self._pg.size():
            raise ValueError(f"consolidate_state_dict: to={to} is not a rank of the group (size {self._pg.size()})")
        full = self.full_state_dict()
        self._consolidated = full if self._pg.rank() == to else None

    def full_state_dict(self) -> dict:
        """The whole state in ``optimizer_class``'s format on every rank (collective: one
        allgather per state slot): for ``torch.distributed.checkpoint``, where every rank passes
        the same dict and each tensor is written once."""
        return self._torch_state_dict(self._engine.gather_state())

    def state_dict(self) -> dict:
        """The whole optimizer state in the format of ``optimizer_class`` (loadable by it):
        ``{"state": {param index: {slot: tensor shaped like the parameter, scalar: tensor}},
        "param_groups": [...]}``.

        Raises:
            RuntimeError: ``consolidate_state_dict(to=this rank)`` was not called first.
        """
        if self._consolidated is None:
            raise RuntimeError("ZeroRedundancyOptimizer.state_dict(): call consolidate_state_dict(to=rank) on "
                               f"every rank first, then state_dict() on that rank (this is rank {self._pg.rank()})")
        return self._consolidated

    def _torch_state_dict(self, full: dict) -> dict:
        scalars, kinds = self._engine.scalars, self._engine.stepper.probe.scalars
        # torch keeps no entry for a parameter without state (SGD without momentum)
        has_state = bool(kinds) or len(self._engine.stepper.slots) > 1
        state, groups, index, offset = {}, [], 0, 0
        for gi, group in enumerate(self.param_groups):
            first = index
            for p in group["params"]:
                if has_state and scalars is not None and scalars[gi] is not None:
                    entry = {k: (v if kinds[k] is None else torch.tensor(v, dtype=kinds[k]))
                             for k, v in scalars[gi].items()}
                    for name in self._engine.stepper.slots[1:]:
                        entry[name] = torch.from_numpy(full[name][offset:offset + p.numel()].copy()).view_as(p)
                    state[index] = entry
                index, offset = index + 1, offset + p.numel()
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(first, index))})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a whole state (from ``state_dict()``, or from ``optimizer_class``'s own
        ``state_dict()``); every rank passes the same dict and keeps its shard. Collective.

        Raises:
            ValueError: the dict's param groups do not match this optimizer's (count, sizes), or
                the params of one group hold different scalars (step counts).
        """
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"load_state_dict: the state has groups of {[len(g['params']) for g in saved_groups]} "
                             f"params, this optimizer {[len(g['params']) for g in self.param_groups]}")
        slots = {name: np.zeros(self._engine.numel, np.float32) for name in self._engine.stepper.slots[1:]}
        scalars, offset = [], 0
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
            seen = []
            for p, key in zip(group["params"], saved["params"]):
                entry = state_dict["state"].get(key, {})
                for name in slots:
                    if name in entry:
                        slots[name][offset:offset + p.numel()] = entry[name].detach().reshape(-1).float().cpu().numpy()
                seen.append({k: float(entry[k]) for k in self._engine.stepper.probe.scalars if k in entry} or None)
                offset += p.numel()
            if any(s != seen[0] for s in seen):
                raise ValueError(f"load_state_dict: the params of one group hold different scalars {seen}: a "
                                 "sharded optimizer keeps one value per group")
            scalars.append(seen[0] if seen else None)
        self._engine.stepper.set_hyper(self.param_groups)
        self._engine.load_state(slots, scalars if any(s is not None for s in scalars) else None)
