"""Closed forms of the goodput model (docs/GOODPUT.md derives each one).

ETTR (effective training time ratio) here is the time the work done would take at full size,
without failures and without fault-tolerance overhead (replication, checkpoints), divided by the
wall time: time at a shrunk size counts at its fraction of the full size's throughput (strong
scaling, fixed global batch). Every time is in seconds, every rate per second. Failures are
Poisson (exponential times between events), as in Young (1974) and Daly (2006).

Sources:
* Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
  T = sqrt(2 C M).
* Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
  Generation Computer Systems 22(3), 2006: first order T = sqrt(2 C (M + R)); the complete
  model's wall time for work W, M e^(R/M) (e^((T+C)/M) - 1) W / T, and its higher-order optimum.
"""
from __future__ import annotations

import math

import numpy as np

from .inputs import Cluster, Costs, Policy

DAY_S = 86400.0


def young_daly_interval(checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Daly's first-order optimum compute time between checkpoints, sqrt(2 C (M + R)) in seconds
    (Young's sqrt(2 C M) with R = 0). Good to about sqrt(C / 2M) (``exact_optimal_interval``).

    Raises:
        ValueError: a negative cost or a non-positive MTBF.
    """
    if checkpoint_s < 0 or restart_s < 0 or not mtbf_s > 0:
        raise ValueError("checkpoint_s and restart_s must be >= 0, mtbf_s > 0")
    return math.sqrt(2 * checkpoint_s * (mtbf_s + restart_s))


def daly_higher_order_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006)'s higher-order optimum: sqrt(2CM) (1 + sqrt(C/2M)/3 + C/18M) - C for C < 2M,
    else M (seconds)."""
    c, m = checkpoint_s, mtbf_s
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def lambert_w0(x: float) -> float:
    """The principal branch W0 of Lambert's function (w e^w = x, w >= -1) for x >= -1/e, by
    Halley's iteration.

    Raises:
        ValueError: x < -1/e.
    """
    if x < -1 / math.e - 1e-15:
        raise ValueError(f"lambert_w0 is real only for x >= -1/e, got {x}")
    if x <= -1 / math.e:
        return -1.0
    w = math.sqrt(2 * (math.e * x + 1)) - 1 if x < 0 else math.log1p(x)  # branch-point series, or log
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - x
        step = f / (ew * (w + 1) - (w + 2) * f / (2 * w + 2))
        w -= step
        if abs(step) <= 1e-15 * (1 + abs(w)):
            break
    return w


def exact_optimal_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The interval T that maximizes ``checkpoint_restart_ettr``: setting its derivative to zero
    gives e^((T+C)/M) (1 - T/M) = 1, so T = M (1 + W0(-e^(-1 - C/M))) (seconds). It does not
    depend on R: in the exact model R only scales the wall time by e^(R/M). Near the branch
    point (C/M < 5e-5, where -e^(-1 - C/M) rounds to -1/e) W0's series in p = sqrt(2 (1 -
    e^(-C/M))) is used: 1 + W0 = p - p^2/3 + 11 p^3/72 - 43 p^4/540 (error below p^5)."""
    p = math.sqrt(-2 * math.expm1(-checkpoint_s / mtbf_s))
    if p < 1e-2:
        return mtbf_s * (p - p * p / 3 + 11 * p ** 3 / 72 - 43 * p ** 4 / 540)
    return mtbf_s * (1 + lambert_w0(-math.exp(-1 - checkpoint_s / mtbf_s)))


def checkpoint_restart_ettr(interval_s, checkpoint_s: float, restart_s: float, mtbf_s: float):
    """ETTR of checkpoint-restart (every failure event ends the job): T e^(-R/M) / (M (e^((T+C)/M)
    - 1)), the inverse of Daly's complete model per unit of work (T compute seconds between
    checkpoints of C seconds, restart R, exponential failures of mean M, failures also during
    checkpoints and restarts). ``interval_s`` may be a numpy array."""
    t = np.asarray(interval_s, dtype=float)
    out = t * np.exp(-restart_s / mtbf_s) / (mtbf_s * np.expm1((t + checkpoint_s) / mtbf_s))
    return float(out) if out.ndim == 0 else out


def buddy_nodes(cluster: Cluster, k: int) -> int:
    """Nodes that hold replicas of one node's shards: k, at most nodes - 1."""
    return max(0, min(k, cluster.nodes - 1))


def single_failure_loss_probability(cluster: Cluster, k: int, window_s: float) -> float:
    """Probability that one single-node failure completes a chain of k + 1 consecutive nodes
    (a node and the k nodes holding its shards' replicas: ftcomm's node-aware buddies are the
    next k nodes, ftcomm/training/buddies.py) that are all down within ``window_s`` of each
    other: (k + 1) (lambda W)^k, lambda the rate of single-node failures of one node (first
    order in lambda W). 1 when k is 0."""
    kk = buddy_nodes(cluster, k)
    if kk == 0:
        return 1.0
    lam = (1 - cluster.correlated_fraction) / cluster.node_mtbf_s
    return min(1.0, (kk + 1) * (lam * window_s) ** kk)


def group_failure_loses_state(cluster: Cluster, k: int) -> bool:
    """Whether a correlated event (c consecutive nodes down together) loses a shard and all its
    replicas: yes when c >= k + 1 (the group holds a node and its k buddy nodes)."""
    return min(cluster.correlated_nodes, cluster.nodes) >= buddy_nodes(cluster, k) + 1


def disk_fallback_rate(cluster: Cluster, k: int, window_s: float) -> float:
    """Events per second in which ftcomm loses a shard and all its k replicas and must read its
    disk checkpoint (or, with a whole job's nodes lost, restart): correlated events that span
    k + 1 consecutive nodes, p * Lambda * [c >= k + 1], plus chains of independent failures
    within ``window_s``, n (k + 1) lambda^(k+1) W^k (n nodes, lambda = (1 - p) / node MTBF; first
    order in lambda W). Every event when k = 0 or the job has one node."""
    kk = buddy_nodes(cluster, k)
    if kk == 0:
        return cluster.event_rate
    group = cluster.correlated_fraction * cluster.event_rate * group_failure_loses_state(cluster, k)
    lam = (1 - cluster.correlated_fraction) / cluster.node_mtbf_s
    return group + cluster.nodes * (kk + 1) * lam ** (kk + 1) * window_s ** kk


def disk_fallback_probability(cluster: Cluster, k: int, window_s: float, horizon_s: float = DAY_S) -> float:
    """Probability of at least one disk fallback in ``horizon_s`` seconds (default a day):
    1 - exp(-rate * horizon) with ``disk_fallback_rate`` (Poisson)."""
    return -math.expm1(-disk_fallback_rate(cluster, k, window_s) * horizon_s)


def regrow_threshold(cluster: Cluster, costs: Costs) -> float:
    """The capacity below which a shrunk job should restart at full size: 1 - sqrt(2 (C + R)
    l / M_node), l the nodes lost per event. Minimizing the restart cost per cycle (C + R) over
    the cycle (1 - theta) M_node / l plus the mean capacity lost, (1 - theta) / 2, gives it (the
    same argument as Young's); first order, without spares. At least half the job."""
    u = math.sqrt(2 * (costs.checkpoint_s + costs.restart_s) * cluster.nodes_per_event / cluster.node_mtbf_s)
    return max(0.5, 1 - u)


class _Events:
    """Per-event probabilities of ftcomm's outcomes (module docstring of ``ftcomm_ettr``)."""

    def __init__(self, cluster: Cluster, costs: Costs, k: int, fatal_applies: bool = True, warm: bool = False):
        n, p, c = cluster.nodes, cluster.correlated_fraction, cluster.correlated_nodes
        # every node of the job at once: a one-node job, or a correlated group as big as the job
        self.all_lost = 1.0 if n == 1 else p * (c >= n)
        fatal = cluster.fatal_fraction if fatal_applies else 0.0
        ends_job = self.all_lost + (1 - self.all_lost) * fatal
        q = 1.0
        if n == 1:
            self.disk = 0.0
        else:
            p_group = p * (c < n) / (1 - self.all_lost)
            q = min(1.0, p_group * group_failure_loses_state(cluster, k) + (1 - p_group)
                    * single_failure_loss_probability(cluster, k, costs.vulnerable_s))
            self.disk = (1 - ends_job) * q
        # an end of the job that left every shard on a live node: a warm relaunch, no rollback
        self.warm = (ends_job - self.all_lost) * (1 - q) if warm else 0.0
        self.fatal = ends_job - self.warm
        self.memory = 1 - ends_job - self.disk


def _rollbacks(cluster: Cluster, costs: Costs, k: int, warm: bool = False) -> tuple[float, float]:
    """(rate, mean stall) of the events after which ftcomm redoes work since its last disk
    checkpoint: its disk fallbacks (stall ``Costs.disk_stall_s``) and the events that end the job
    (stall R), but for those a warm relaunch survives (``warm``)."""
    ev = _Events(cluster, costs, k, warm=warm)
    share = ev.disk + ev.fatal
    if share <= 0:
        return 0.0, 0.0
    return cluster.event_rate * share, (ev.disk * costs.disk_stall_s() + ev.fatal * costs.restart_s) / share


def ftcomm_disk_interval(cluster: Cluster, costs: Costs, policy: Policy) -> float:
    """Compute seconds between ftcomm's disk checkpoints: ``policy.disk_interval_s``, else the
    optimum of Daly's complete model (``exact_optimal_interval``) for the events that need the
    disk (``_rollbacks``: the disk fallbacks and the fatal events), which is Young/Daly's
    sqrt(2 C (M + R)) to first order. ``math.inf`` when no event needs it."""
    if policy.disk_interval_s is not None:
        return policy.disk_interval_s
    rate, _ = _rollbacks(cluster, costs, policy.k, policy.warm_restart)
    if rate <= 0:
        return math.inf
    return exact_optimal_interval(costs.checkpoint_s, 1 / rate)


def ftcomm_ettr(cluster: Cluster, costs: Costs, policy: Policy, spares: bool = False) -> dict:
    """Expected ETTR of a long run with ftcomm (``montecarlo`` simulates the same process event
    by event; the tests hold the two together).

    The process: failure events at rate Lambda (``Cluster.event_rate``). An event ends the job
    (probability ``fatal``: a one-node job, a group as big as the job, ``fatal_fraction``): a
    restart, R seconds, redoing the work since the last disk checkpoint. Otherwise it loses a
    shard and its replicas with probability ``disk`` (``disk_fallback_rate``): the survivors read
    the disk checkpoint (``Costs.disk_stall_s``) and redo the work since it. Otherwise an
    in-memory recovery (``Costs.memory_stall_s``). With ``spares`` the first
    ``policy.spare_nodes`` lost nodes are replaced, then the job shrinks; below
    ``policy.regrow_below`` of its nodes it writes a checkpoint and restarts at full size (C + R).
    With ``policy.warm_restart`` an end of the job that left every shard on a live node
    (probability ``warm``) is a relaunch from the nodes' memory (``Costs.warm_stall_s``, nothing
    rolled back), and the job goes on shrunk as after an in-memory recovery.

    ETTR = mean capacity x (1 - k x replication share) x M x D, where
    * mean capacity: nodes left / nodes over a cycle between restarts (time at a shrunk size
      counts at that share of the full size's throughput);
    * M = 1 - Lambda (p_memory L + p_warm W + planned (C + R)): the time not spent in in-memory
      recoveries of L seconds, warm relaunches of W seconds and planned restarts (``planned`` of
      them per event; first order);
    * D = ``checkpoint_restart_ettr``(T_d, C, R_d, 1 / mu): Daly's complete model for the events
      that roll back to the disk checkpoint (rate mu, mean stall R_d, ``_rollbacks``), with
      checkpoints every T_d compute seconds (``ftcomm_disk_interval``); T_d / (T_d + C) when no
      event rolls back.

    Returns:
        dict: ``ettr`` and its factors (``mean_capacity``, ``replication_factor``,
        ``memory_factor``, ``disk_factor``), the probabilities per event (``p_memory``,
        ``p_disk``, ``p_fatal``), ``disk_interval_s``, ``regrow_below``, ``events_per_cycle``,
        ``planned_restarts_per_day`` and ``memory_stall_s``.
    """
    n, lam, ell = cluster.nodes, cluster.event_rate, cluster.nodes_per_event
    ev = _Events(cluster, costs, policy.k, warm=policy.warm_restart)
    theta = policy.regrow_below if policy.regrow_below is not None else regrow_threshold(cluster, costs)
    spare = policy.spare_nodes if spares else 0
    allowed = spare + math.floor((1 - theta) * n + 1e-9)  # nodes that can go before a planned restart
    n_cycle = math.floor(allowed / ell) + 1  # non-fatal events per cycle (the last one restarts)
    s = 1 - ev.fatal  # a cycle goes on after an event
    weights = s ** np.arange(n_cycle)
    length = weights.sum()
    lost_nodes = ell * np.arange(n_cycle)
    capacity = 1 - np.maximum(0.0, lost_nodes - spare) / n
    mean_capacity = float((weights * capacity).sum() / length)
    # event i (1-based) of a cycle is reached with probability s^(i-1) and finds a spare if i l <= S
    share_spare = float(weights[ell * np.arange(1, n_cycle + 1) <= spare].sum() / length)
    stall_mem = share_spare * costs.memory_stall_s(True) + (1 - share_spare) * costs.memory_stall_s(False)
    planned = s ** n_cycle / length  # planned restarts per event
    c, r = costs.checkpoint_s, costs.restart_s
    memory = max(0.0, 1 - lam * (ev.memory * stall_mem + ev.warm * costs.warm_stall_s() + planned * (c + r)))
    t_d = ftcomm_disk_interval(cluster, costs, policy)
    mu, stall_rb = _rollbacks(cluster, costs, policy.k, policy.warm_restart)
    if mu > 0:
        disk = checkpoint_restart_ettr(t_d, c, stall_rb, 1 / mu)
    else:
        disk = 1.0 if math.isinf(t_d) else t_d / (t_d + c)
    replication = max(0.0, 1 - policy.k * costs.replication_share)
    return {"ettr": mean_capacity * replication * memory * disk, "mean_capacity": mean_capacity,
            "replication_factor": replication, "memory_factor": memory, "disk_factor": disk,
            "p_memory": ev.memory, "p_disk": ev.disk, "p_fatal": ev.fatal, "p_warm": ev.warm, "disk_interval_s": t_d,
            "regrow_below": theta, "events_per_cycle": n_cycle,
            "planned_restarts_per_day": planned * lam * DAY_S, "memory_stall_s": stall_mem}


def checkpoint_restart(cluster: Cluster, costs: Costs, interval_s: float | None = None) -> dict:
    """Checkpoint-restart: every failure event ends the job. ETTR (``checkpoint_restart_ettr``)
    at ``interval_s``, default the Young/Daly interval sqrt(2 C (M + R)) with M the job's MTBF.
    The ideal step has no replication, so nothing else is charged."""
    m = cluster.job_mtbf_s
    t = young_daly_interval(costs.checkpoint_s, m, costs.restart_s) if interval_s is None else interval_s
    return {"ettr": checkpoint_restart_ettr(t, costs.checkpoint_s, costs.restart_s, m), "interval_s": t,
            "exact_optimal_interval_s": exact_optimal_interval(costs.checkpoint_s, m), "job_mtbf_s": m}


def torchft(cluster: Cluster, costs: Costs, policy: Policy) -> dict:
    """An idealized torchft-style run: the job is G = nodes / ``policy.replica_group_nodes``
    replica groups (data parallel across groups). A failure pauses every group for the discarded
    step and a new quorum (``Costs.torchft_pause_s``); the failed groups leave and come back
    after ``Costs.torchft_rejoin`` (restart and healing from a peer), training meanwhile at the
    other groups' share. No replication cost, no checkpoint unless every group is lost at once
    (then a restart from a Young/Daly checkpoint). Its own per-step cost,
    ``Costs.torchft_overhead_share``, scales the result. Open MPI's ``fatal_fraction`` does not
    apply (each group is its own job). First order in the failure rate."""
    n, lam = cluster.nodes, cluster.event_rate
    groups = math.ceil(n / policy.replica_group_nodes)
    if groups == 1:  # no healthy peer to heal from: a restart from disk, as checkpoint-restart
        out = checkpoint_restart(cluster, costs)
        out.update(groups=1)
        return out
    p, c = cluster.correlated_fraction, cluster.correlated_nodes
    per_group = math.ceil(c / policy.replica_group_nodes)
    all_lost = p * (per_group >= groups)
    groups_lost = (1 - p) * 1 + p * min(per_group, groups) * (per_group < groups)
    rate_disk = lam * all_lost
    pause, rejoin = costs.torchft_pause_s, costs.torchft_rejoin
    if rate_disk > 0:
        t_d = young_daly_interval(costs.checkpoint_s, 1 / rate_disk, costs.restart_s)
        ckpt, lost = t_d / (t_d + costs.checkpoint_s), rate_disk * t_d / 2
    else:
        t_d, ckpt, lost = math.inf, 1.0, 0.0
    productive = (1 - all_lost) * math.exp(-lam * pause) + all_lost * math.exp(-lam * costs.restart_s)
    away = lam * groups_lost / groups * rejoin  # group-seconds away per second, as a share
    ettr = max(0.0, (productive * ckpt - lost) * (1 - away)) * (1 - costs.torchft_overhead_share)
    return {"ettr": ettr, "groups": groups, "pause_s": pause,
            "rejoin_s": rejoin, "productive_fraction": productive, "away_share": away, "disk_interval_s": t_d}
