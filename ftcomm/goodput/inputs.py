"""The inputs of the goodput model: the cluster, the measured costs, the policy.

Every time is in seconds. ``Costs.from_json`` reads benchmarks/mttr.py's ``mttr.json`` or the
``costs.json`` that ``ftcomm-report`` writes (the same layout: a ``results`` list whose entries
have ``steady``, ``memory``, ``memory_spares`` and ``disk``).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Cluster:
    """The machine a job runs on and how it fails.

    Attributes:
        world_size: ranks (one per GPU).
        ranks_per_node: ranks on one node; a node failure loses all of them.
        node_mtbf_s: mean time between failure events started by one node (seconds); the job
            sees events at rate ``nodes / node_mtbf_s`` (Poisson, independent nodes).
        correlated_fraction: the fraction p of events that take down a whole group of
            ``correlated_nodes`` consecutive nodes (a rack, a switch, a power domain) instead of
            one node.
        correlated_nodes: c, the nodes of such a group (aligned: nodes c*i .. c*i + c - 1).
        fatal_fraction: the fraction of events that end the whole job whatever ftcomm does (with
            Open MPI 5.0.x a node crash that takes its PRRTE daemon ends the job: docs/NODE_LOSS.md).
    """

    world_size: int
    ranks_per_node: int = 8
    node_mtbf_s: float = 1250 * 3600.0
    correlated_fraction: float = 0.0
    correlated_nodes: int = 1
    fatal_fraction: float = 0.0

    def __post_init__(self):
        if self.world_size < 1 or self.ranks_per_node < 1:
            raise ValueError("world_size and ranks_per_node must be at least 1")
        if not self.node_mtbf_s > 0:
            raise ValueError("node_mtbf_s must be positive")
        if not 0 <= self.correlated_fraction <= 1 or not 0 <= self.fatal_fraction <= 1:
            raise ValueError("correlated_fraction and fatal_fraction must be in [0, 1]")
        if self.correlated_nodes < 1:
            raise ValueError("correlated_nodes must be at least 1")

    @property
    def nodes(self) -> int:
        """Nodes of the job: ceil(world_size / ranks_per_node)."""
        return math.ceil(self.world_size / self.ranks_per_node)

    @property
    def event_rate(self) -> float:
        """Failure events per second for the job: nodes / node_mtbf_s."""
        return self.nodes / self.node_mtbf_s

    @property
    def job_mtbf_s(self) -> float:
        """Mean time between failure events of the job (seconds)."""
        return 1.0 / self.event_rate

    @property
    def nodes_per_event(self) -> float:
        """Mean nodes lost per event: 1 + p (c - 1), at most the job's nodes."""
        return 1 + self.correlated_fraction * (min(self.correlated_nodes, self.nodes) - 1)


@dataclass(frozen=True)
class Costs:
    """Measured costs (seconds), at the world size they were measured at.

    Attributes:
        step_s: one training step with ftcomm (replication with k=1 included).
        replication_share: the share of ``step_s`` spent replicating to one buddy (k=1); k
            buddies cost k times as much (each gets its own copy).
        detection_s, agree_shrink_s, rebuild_s, redo_s: the phases of an in-memory recovery by
            shrinking (benchmarks/mttr.py's MTTR split; ``redo_s`` is the redone step).
        pre_failure_s: work of the interrupted step done before the failure, lost with it; None
            means half a step (a failure at a uniformly random time).
        spares_*: the same phases when a spare takes the failed rank's place (None: as shrink).
        checkpoint_s: C, writing one disk checkpoint (the training waits for it).
        restart_s: R, checkpoint-restart's time from a failure until training runs again
            (abort, relaunch, load).
        disk_restore_s: ftcomm's disk fallback inside the running job: reading the checkpoint.
        warm_restart_s: a job that ended is relaunched and resumes from its nodes' shared memory:
            from the failure to the first step after it (the relaunch's start-up, listing and
            re-sharding the segments, the step), nothing redone (None: ``restart_s`` less
            ``disk_restore_s``, a cold restart without its load).
        torchft_recover_s: idealized torchft: the healthy replica groups' pause to agree on a new
            quorum (None: detection_s + agree_shrink_s).
        torchft_rejoin_s: idealized torchft: a failed group's restart and healing from a peer,
            during which it does not train (None: restart_s).
        torchft_overhead_share: idealized torchft: the share of its step time that its per-step
            quorum and commit add (0: none; 0.05-0.29 measured here, REFERENCES.md: its steps took
            1.05-1.42x plain DDP's).
        source: where the figures come from.
    """

    step_s: float
    replication_share: float
    detection_s: float
    agree_shrink_s: float
    rebuild_s: float
    redo_s: float
    checkpoint_s: float
    restart_s: float
    disk_restore_s: float
    pre_failure_s: float | None = None
    warm_restart_s: float | None = None
    spares_detection_s: float | None = None
    spares_agree_shrink_s: float | None = None
    spares_rebuild_s: float | None = None
    spares_redo_s: float | None = None
    torchft_recover_s: float | None = None
    torchft_rejoin_s: float | None = None
    torchft_overhead_share: float = 0.0
    source: str = ""

    def __post_init__(self):
        for name, value in asdict(self).items():
            if isinstance(value, float) and (value < 0 or math.isnan(value)):
                raise ValueError(f"cost {name} = {value}: must be a non-negative number of seconds")
        if not self.step_s > 0:
            raise ValueError("step_s must be positive")
        if self.replication_share >= 1 or self.torchft_overhead_share >= 1:
            raise ValueError("replication_share and torchft_overhead_share must be below 1")

    def with_overrides(self, **overrides) -> "Costs":
        """A copy with the fields given (None values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def pre_s(self) -> float:
        """Work lost of the interrupted step: ``pre_failure_s``, or half a step."""
        return self.step_s / 2 if self.pre_failure_s is None else self.pre_failure_s

    def memory_stall_s(self, spares: bool = False) -> float:
        """Wall time one in-memory recovery adds to a run: the interrupted step's work, detection,
        agreement and shrink (or the spare round), rebuild, and what the redone step takes more
        than a steady one."""
        d, a, b, r = self.detection_s, self.agree_shrink_s, self.rebuild_s, self.redo_s
        if spares:
            d = _or(self.spares_detection_s, d)
            a = _or(self.spares_agree_shrink_s, a)
            b = _or(self.spares_rebuild_s, b)
            r = _or(self.spares_redo_s, r)
        return self.pre_s + d + a + b + max(0.0, r - self.step_s)

    def disk_stall_s(self) -> float:
        """Wall time of ftcomm's disk fallback, less the work redone since the checkpoint: the
        interrupted step, detection, agreement and shrink, reading the checkpoint, the redo."""
        return self.pre_s + self.detection_s + self.agree_shrink_s + self.disk_restore_s + max(0.0, self.redo_s - self.step_s)

    def warm_stall_s(self) -> float:
        """Wall time of a relaunch that resumes from the nodes' memory: the interrupted step's
        work and ``warm_restart_s`` (else ``restart_s - disk_restore_s``)."""
        return self.pre_s + _or(self.warm_restart_s, max(0.0, self.restart_s - self.disk_restore_s))

    @property
    def vulnerable_s(self) -> float:
        """How long a failed node's shards have only their replicas: detection + agreement and
        shrink + rebuild (the rebuild makes new replicas)."""
        return self.detection_s + self.agree_shrink_s + self.rebuild_s

    @property
    def torchft_pause_s(self) -> float:
        """Idealized torchft: the healthy groups' pause per failure (the discarded step's work,
        the quorum)."""
        return self.pre_s + _or(self.torchft_recover_s, self.detection_s + self.agree_shrink_s)

    @property
    def torchft_rejoin(self) -> float:
        return _or(self.torchft_rejoin_s, self.restart_s)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, path, size: str | None = None, require_disk: bool = True, **overrides) -> "Costs":
        """Costs from benchmarks/mttr.py's ``mttr.json`` or ``ftcomm-report``'s ``costs.json``.

        Args:
            path: the JSON file.
            size: which entry of ``results`` (mttr.py's "1M", "10M", ...); default the only one,
                or the last.
            require_disk: whether checkpoint_s, restart_s and disk_restore_s must be known; if
                not, a missing one is 0 (for uses that do not read them).
            overrides: fields to set instead of (or where the file has no) measured value.

        Raises:
            FileNotFoundError: no such file.
            ValueError: no usable entry, or a cost that neither the file nor ``overrides`` gives
                (checkpoint_s, restart_s and disk_restore_s come from mttr.py's disk run).
        """
        data = json.loads(Path(path).read_text())
        results = [r for r in data.get("results", []) if "steady" in r]
        if size is not None:
            results = [r for r in results if r.get("size") == size]
        if not results:
            raise ValueError(f"{path}: no results entry" + (f" of size {size!r}" if size else "")
                             + " with steady-step figures")
        entry = results[-1]
        steady = entry["steady"]
        memory = entry.get("memory") or entry.get("memory_spares")
        spares = entry.get("memory_spares") or {}
        if memory is None or "detection_s" not in memory:
            raise ValueError(f"{path}: entry {entry.get('size')!r} has no in-memory recovery (memory)")
        disk = entry.get("disk") or {}
        step = float(steady["step_s"])
        k_file = data.get("replicas") or 1  # mttr.py measures k = 1; a report says what its run used
        fields = dict(
            step_s=step, replication_share=float(steady.get("replication_overhead") or 0.0) / k_file,
            detection_s=memory["detection_s"], agree_shrink_s=memory["agree_shrink_s"],
            rebuild_s=memory["rebuild_s"], redo_s=memory["redo_s"], pre_failure_s=memory.get("pre_failure_s"),
            spares_detection_s=spares.get("detection_s"), spares_agree_shrink_s=spares.get("agree_shrink_s"),
            spares_rebuild_s=spares.get("rebuild_s"), spares_redo_s=spares.get("redo_s"),
            checkpoint_s=disk.get("checkpoint_s"),
            restart_s=None if "mttr_s" not in disk else max(0.0, disk["mttr_s"] - step),
            disk_restore_s=disk.get("load_s"),
            source=f"{path}" + (f" [{entry.get('size')}]" if entry.get("size") else ""))
        fields.update({k: v for k, v in overrides.items() if v is not None})
        missing = [k for k in ("checkpoint_s", "restart_s", "disk_restore_s") if fields.get(k) is None]
        if missing and not require_disk:
            fields.update({k: 0.0 for k in missing})
        elif missing:
            raise ValueError(f"{path} has no {', '.join(missing)} (benchmarks/mttr.py's disk run measures them): "
                             "give them as options (" + ", ".join("--" + m.replace("_", "-") for m in missing) + ")")
        return cls(**{k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                      for k, v in fields.items()})


def _or(value, default):
    return default if value is None else value


@dataclass(frozen=True)
class Policy:
    """What ftcomm is set up to do.

    Attributes:
        k: buddies per shard.
        spare_nodes: idle spare nodes launched with the job (``ftcomm-run --spares``); they take
            failed nodes' places until they run out (Open MPI 5.0.x cannot add processes later).
        regrow_below: when failures have shrunk the job below this fraction of its nodes, it
            writes a checkpoint and restarts at full size (a planned restart). None: the
            threshold that balances the two, ``model.regrow_threshold``.
        disk_interval_s: compute time between ftcomm's disk checkpoints. None: the optimum for the
            rate of events that need the disk (``model.ftcomm_disk_interval``, Young/Daly's to
            first order).
        replica_group_nodes: idealized torchft: nodes per replica group.
        warm_restart: shards and replicas in node-local shared memory (``FTCOMM_WARM``): a job
            that ends with every shard still held by a live node is relaunched and resumes from
            there (``Costs.warm_stall_s``) instead of rolling back to its disk checkpoint.
    """

    k: int = 1
    spare_nodes: int = 0
    regrow_below: float | None = None
    disk_interval_s: float | None = None
    replica_group_nodes: int = 1
    warm_restart: bool = False

    def __post_init__(self):
        if self.k < 0 or self.spare_nodes < 0 or self.replica_group_nodes < 1:
            raise ValueError("k and spare_nodes must be >= 0, replica_group_nodes >= 1")
        if self.regrow_below is not None and not 0 < self.regrow_below <= 1:
            raise ValueError("regrow_below must be in (0, 1]")
        if self.disk_interval_s is not None and not self.disk_interval_s > 0:
            raise ValueError("disk_interval_s must be positive")


@dataclass
class Scenario:
    """One model evaluation's inputs together (for the JSON output)."""

    cluster: Cluster
    costs: Costs
    policy: Policy = field(default_factory=Policy)

    def as_dict(self) -> dict:
        return {"cluster": asdict(self.cluster), "costs": asdict(self.costs), "policy": asdict(self.policy)}
