"""Monte Carlo simulation of long training runs, vectorized with numpy over trials (and over
world sizes): the same processes that ``model`` gives in closed form, simulated event by event
without its first-order approximations (docs/GOODPUT.md).

Every function takes a ``numpy.random.Generator`` and returns per-trial results, so that callers
report a mean and a spread. Times in seconds.
"""
from __future__ import annotations

import math

import numpy as np

from .inputs import Cluster, Costs, Policy
from .model import (DAY_S, buddy_nodes, ftcomm_disk_interval, regrow_threshold,
                    single_failure_loss_probability, torchft)


def _exponential_gaps(rng: np.random.Generator, mtbf_s: float, horizon_s: float, trials: int) -> np.ndarray:
    """(trials, E) exponential times between events, enough that every row spans ``horizon_s``."""
    mean = horizon_s / mtbf_s
    count = int(mean + 8 * math.sqrt(mean) + 16)
    gaps = rng.exponential(mtbf_s, size=(trials, count))
    while gaps.sum(axis=1).min() < horizon_s:
        gaps = np.concatenate([gaps, rng.exponential(mtbf_s, size=(trials, count))], axis=1)
    return gaps


def simulate_checkpoint_restart(mtbf_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                                horizon_s: float, trials: int, rng: np.random.Generator) -> np.ndarray:
    """ETTR of each of ``trials`` checkpoint-restart runs of ``horizon_s`` seconds: failures with
    exponential gaps of mean ``mtbf_s``; after each, a restart of ``restart_s`` (a failure during
    it starts it again); then compute segments of ``interval_s`` each followed by a checkpoint of
    ``checkpoint_s``; a failure loses the segment in progress. Only segments whose checkpoint
    completed count (the run's last partial segment too is left out). Shape (trials,)."""
    gaps = _exponential_gaps(rng, mtbf_s, horizon_s, trials)
    starts = np.cumsum(gaps, axis=1) - gaps
    usable = np.clip(np.minimum(gaps, horizon_s - starts), 0.0, None)
    usable[:, 1:] -= restart_s  # every gap after the first begins with a restart
    segments = np.floor(np.clip(usable, 0.0, None) / (interval_s + checkpoint_s))
    return segments.sum(axis=1) * interval_s / horizon_s


def _advance(a, productive, t_d: np.ndarray, c: float):
    """Compute ``productive`` wall seconds with a checkpoint of ``c`` s after every ``t_d`` compute
    seconds, starting ``a`` compute seconds after the last one. Returns (compute seconds done,
    new a, whether a checkpoint completed, compute seconds since the last completed one)."""
    finite = np.isfinite(t_d)
    td = np.where(finite, t_d, 1.0)
    need = np.where(finite, td - a, np.inf)
    first = need + c
    before = productive < need
    writing = ~before & (productive < first)
    rest = np.clip(productive - first, 0.0, None)
    whole = np.floor(rest / (td + c))
    tail = np.minimum(rest - whole * (td + c), td)
    done = ~before & ~writing
    compute = np.where(before, productive, np.where(writing, need, need + whole * td + tail))
    a_new = np.where(before, a + productive, np.where(writing, td, tail))
    return compute, a_new, done, np.where(done, tail, 0.0)


def simulate_ftcomm(clusters: list[Cluster], costs: Costs, policy: Policy, spares: bool, horizon_s: float,
                    trials: int, rng: np.random.Generator, spare_nodes: list[int] | None = None) -> dict:
    """Simulates ``trials`` runs of ``horizon_s`` seconds with ftcomm for each cluster, all in one
    vectorized event loop (the process of ``model.ftcomm_ettr``).

    Per event, drawn independently: a correlated group (probability p, c consecutive nodes)
    or one node; the end of the job (a one-node job, a group as big as the job, or
    ``fatal_fraction``); a lost shard (a group of >= k + 1 nodes, or a single failure that
    completes a chain of k + 1 down nodes, probability ``model.single_failure_loss_probability``).
    With ``policy.warm_restart`` a job that ended with no shard lost (not every node gone) is
    relaunched and resumes from its nodes' memory (``Costs.warm_stall_s``, nothing redone, the
    job goes on shrunk); any other end is fatal. Spares replace lost nodes
    while they last, then the job shrinks; a planned restart (C + R) brings it back to full size
    below ``regrow_below`` (``spare_nodes``: spares of each cluster, default
    ``policy.spare_nodes``). An event during a stall makes the stall last until the later of the
    two ends (a failure during a restart starts the restart over, as in Daly's model; an
    in-memory recovery during a restart adds nothing). Work is counted in full-size compute seconds
    (capacity x (1 - k x replication share)); a disk fallback or a restart loses the work since
    the last completed disk checkpoint.

    Returns:
        dict of arrays of shape (len(clusters), trials): ``ettr``, ``events``, ``disk_fallbacks``,
        ``fatal``, ``planned_restarts``.
    """
    rows = len(clusters)
    shape = (rows, trials)
    col = lambda values: np.repeat(np.asarray(values, dtype=float)[:, None], trials, axis=1)  # noqa: E731
    n = col([cl.nodes for cl in clusters])
    rate = col([cl.event_rate for cl in clusters])
    p = col([cl.correlated_fraction for cl in clusters])
    csize = col([min(cl.correlated_nodes, cl.nodes) for cl in clusters])
    fatal_p = col([cl.fatal_fraction for cl in clusters])
    kk = col([buddy_nodes(cl, policy.k) for cl in clusters])
    q_single = col([single_failure_loss_probability(cl, policy.k, costs.vulnerable_s) for cl in clusters])
    theta = [policy.regrow_below if policy.regrow_below is not None else regrow_threshold(cl, costs) for cl in clusters]
    allowed = col([math.floor((1 - th) * cl.nodes + 1e-9) for th, cl in zip(theta, clusters)])
    t_d = col([ftcomm_disk_interval(cl, costs, policy) for cl in clusters])
    spare0 = col(spare_nodes if spare_nodes is not None else [policy.spare_nodes] * rows) * bool(spares)
    repl = max(0.0, 1 - policy.k * costs.replication_share)
    stall_spare, stall_shrink = costs.memory_stall_s(True), costs.memory_stall_s(False)
    stall_disk, restart, c = costs.disk_stall_s(), costs.restart_s, costs.checkpoint_s
    stall_warm = costs.warm_stall_s()

    t = np.zeros(shape)
    stall = np.zeros(shape)
    spares_left = spare0.copy()
    shrunk = np.zeros(shape)
    a = np.zeros(shape)
    since = np.zeros(shape)
    work = np.zeros(shape)
    counts = {k: np.zeros(shape, dtype=np.int64) for k in ("events", "disk_fallbacks", "fatal", "planned_restarts")}
    while True:
        live = t < horizon_s
        if not live.any():
            break
        gap = rng.standard_exponential(shape) / rate
        span = np.where(live, np.minimum(gap, horizon_s - t), 0.0)
        productive = np.clip(span - stall, 0.0, None)
        remaining = np.clip(stall - span, 0.0, None)  # of a stall the next event interrupts
        speed = (1 - shrunk / n) * repl
        compute, a, done, after = _advance(a, productive, t_d, c)
        work += compute * speed
        since = np.where(done, after * speed, since + compute * speed)
        t += np.where(live, gap, 0.0)
        happens = live & (t < horizon_s)
        group = rng.random(shape) < p
        lost = np.where(group, csize, 1.0)
        whole = (n == 1) | (group & (csize >= n))  # every node of the job: nothing kept anywhere
        ends_job = happens & (whole | (rng.random(shape) < fatal_p))
        u = rng.random(shape)
        state_lost = (kk == 0) | np.where(group, csize >= kk + 1, u < q_single)
        # the job ended but the other nodes' memory holds every shard: relaunched, it resumes there
        warm = ends_job & ~whole & ~state_lost & bool(policy.warm_restart)
        fatal = ends_job & ~warm
        disk = happens & ~ends_job & state_lost
        memory = happens & ~fatal
        use = np.minimum(lost, spares_left)
        new_stall = np.where(use > 0, stall_spare, stall_shrink)
        new_stall = np.where(disk, stall_disk, new_stall)
        new_stall = np.where(warm, stall_warm, new_stall)
        spares_left = np.where(memory, spares_left - use, spares_left)
        shrunk = np.where(memory, shrunk + lost - use, shrunk)
        planned = memory & (shrunk > allowed)
        new_stall = np.where(planned, new_stall + c + restart, new_stall)
        new_stall = np.where(fatal, restart, new_stall)
        reset = fatal | planned
        work -= np.where(fatal | disk, since, 0.0)
        since = np.where(fatal | disk | planned, 0.0, since)
        a = np.where(fatal | disk | planned, 0.0, a)
        shrunk = np.where(reset, 0.0, shrunk)
        spares_left = np.where(reset, spare0, spares_left)
        stall = np.where(happens, np.maximum(remaining, new_stall), stall)
        counts["events"] += happens
        counts["disk_fallbacks"] += disk
        counts["fatal"] += fatal
        counts["planned_restarts"] += planned
    return {"ettr": work / horizon_s, **counts}


def simulate_torchft(cluster: Cluster, costs: Costs, policy: Policy, horizon_s: float, trials: int,
                     rng: np.random.Generator) -> np.ndarray:
    """ETTR of ``trials`` idealized torchft-style runs (the process of ``model.torchft``): each
    event pauses every group (``Costs.torchft_pause_s``) and takes its groups away for
    ``Costs.torchft_rejoin`` seconds of the following productive time; an event that takes every
    group is a restart from a Young/Daly checkpoint that loses a uniform share of its interval.
    Its per-step overhead share scales the result. Shape (trials,)."""
    ref = torchft(cluster, costs, policy)
    if ref["groups"] == 1:
        return simulate_checkpoint_restart(cluster.job_mtbf_s, ref["interval_s"], costs.checkpoint_s,
                                           costs.restart_s, horizon_s, trials, rng)
    groups = ref["groups"]
    gaps = _exponential_gaps(rng, cluster.job_mtbf_s, horizon_s, trials)
    starts = np.cumsum(gaps, axis=1) - gaps
    span = np.clip(np.minimum(gaps, horizon_s - starts), 0.0, None)
    happened = (starts + gaps) < horizon_s
    per_group = math.ceil(cluster.correlated_nodes / policy.replica_group_nodes)
    group = rng.random(gaps.shape) < cluster.correlated_fraction
    everything = group & (per_group >= groups) & happened
    away = np.where(group, min(per_group, groups), 1) / groups * happened
    # the stall and the away share of event i act on gap i + 1
    stall = np.zeros_like(gaps)
    stall[:, 1:] = np.where(everything[:, :-1], costs.restart_s, ref["pause_s"])
    share = np.zeros_like(gaps)
    share[:, 1:] = np.where(everything[:, :-1], 0.0, away[:, :-1])
    productive = np.clip(span - stall, 0.0, None)
    t_d = ref["disk_interval_s"]
    ckpt = 1.0 if math.isinf(t_d) else t_d / (t_d + costs.checkpoint_s)
    work = productive * ckpt - share * np.minimum(productive, costs.torchft_rejoin)
    if not math.isinf(t_d):
        work -= everything * rng.random(gaps.shape) * t_d
    return work.sum(axis=1) / horizon_s * (1 - costs.torchft_overhead_share)


def simulate_disk_fallback(cluster: Cluster, k: int, window_s: float, horizon_s: float, trials: int,
                           rng: np.random.Generator) -> np.ndarray:
    """Whether each of ``trials`` runs of ``horizon_s`` seconds (default use: a day) needs ftcomm's
    disk fallback at least once, placing failures on nodes: node j's shards have replicas on
    nodes j+1 .. j+k (ring order; ftcomm/training/buddies.py with equal nodes); a node is down
    from its failure until ``window_s`` later (detection, shrink and rebuild, after which its
    shards have fresh replicas); a correlated event downs the c-node group holding the node. A
    shard is lost when a node and its k buddy nodes are down at once. Shape (trials,), bool.

    Raises:
        ValueError: k < 0.
    """
    if k < 0:
        raise ValueError("k must be >= 0")
    n = cluster.nodes
    kk = buddy_nodes(cluster, k)
    counts = rng.poisson(cluster.event_rate * horizon_s, size=trials)
    width = int(counts.max()) if trials else 0
    if width == 0:
        return np.zeros(trials, dtype=bool)
    valid = np.arange(width)[None, :] < counts[:, None]
    times = np.sort(np.where(valid, rng.random((trials, width)) * horizon_s, np.inf), axis=1)
    node = rng.integers(0, n, size=(trials, width))
    c = min(cluster.correlated_nodes, n)
    group = rng.random((trials, width)) < cluster.correlated_fraction
    start = np.where(group, (node // c) * c, node)
    length = np.where(group, np.minimum(c, n - start), 1)
    if kk == 0:
        return valid.any(axis=1)
    span = int(length.max()) + 2 * kk  # offsets from start - kk: the nodes a new chain could use
    offsets = np.arange(span)[None, None, :]
    base = start - kk
    down = np.zeros((trials, width, span), dtype=bool)
    lag = 0
    while lag < width:
        prior_t = np.full((trials, width), -np.inf)
        prior_t[:, lag:] = times[:, : width - lag]
        with np.errstate(invalid="ignore"):  # inf - inf where both are padding (not valid)
            within = valid & (times - prior_t < window_s)
        if lag > 0 and not within.any():
            break
        p_start = np.zeros((trials, width), dtype=np.int64)
        p_len = np.zeros((trials, width), dtype=np.int64)
        p_start[:, lag:] = start[:, : width - lag]
        p_len[:, lag:] = length[:, : width - lag]
        rel = (p_start - base) % n
        covered = (offsets - rel[:, :, None]) % n < p_len[:, :, None]
        down |= covered & within[:, :, None]
        lag += 1
    chain = np.zeros((trials, width), dtype=bool)
    for s in range(span - kk):
        chain |= down[:, :, s: s + kk + 1].all(axis=2)
    return (chain & valid).any(axis=1)


def disk_fallback_per_day(cluster: Cluster, k: int, window_s: float, trials: int, rng: np.random.Generator,
                          horizon_s: float = DAY_S) -> tuple[float, float]:
    """(probability, standard error) of at least one disk fallback in ``horizon_s``, by
    ``simulate_disk_fallback``."""
    hits = simulate_disk_fallback(cluster, k, window_s, horizon_s, trials, rng)
    prob = float(hits.mean())
    return prob, math.sqrt(max(prob * (1 - prob), 1e-300) / trials)
