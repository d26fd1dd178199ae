"""What a run's event logs say about its failures, recoveries and goodput.

Definitions (every time in seconds; "the reference rank" is the lowest world rank that ran from
the run's first step to its end, rank 0 unless rank 0 was lost):

* step time at world size n: the mean interval between two consecutive committed steps at size
  n, leaving out the first two steps of the run (warm-up) and any interval with a failure or a
  disk checkpoint in it.
* a failure: the survivors' ``recovered`` events with the same step and lost ranks. Its time is
  the ``kill`` event the dying rank logged just before dying (the digits demo's ``--kill``), else
  the earliest survivor's start of the failed phase (``detected_time - detection_s``, an upper
  bound of the failure's time).
* its phases, on the reference rank: detection (failure to the error, less the agreement that
  came before the error), agreement (``agree_s``), shrink / spare round (``recover_s``), rebuild
  (``rebuild_s``, or the disk restore), redo (end of the recovery to the first commit after it).
  MTTR = failure to the first commit after it (docs/RECOVERY.md's definition).
* time lost to a failure: from the last commit before it to the commit of the step it interrupted
  (after a disk fallback: once the steps since the checkpoint are redone), less one step at the
  world size after it: the wall time the failure added to the run.
* a relaunch (``ftcomm-run --restarts``: the whole job died and came back, in the same log files
  when the script names its logs by ``ftcomm.settings.job_id()``): a later ``start`` of the
  reference rank, followed by ``resumed``. Its death is the last ``kill`` event before it, else
  the old launch's last event on any rank (an upper bound); phases: relaunch (death to the new
  launch's start: the old job's end, the backoff, mpirun, imports, set-up), load (``load_s``,
  from the nodes' memory or from disk), redo (to the first commit after it). Time lost: as for
  a failure, from the last commit before the death to the commit of the step after it.
* goodput: the time the run's distinct committed steps take at the first world size without
  failures and without replication (mean step time less mean replication time, times the
  steps), divided by the wall time from the reference rank's ``start`` to its last commit.
  ``ftcomm-goodput`` models the same ratio (docs/GOODPUT.md).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from .logs import RunLog

WARMUP_STEPS = 2


def _lost(event) -> float | None:
    """From the last commit before a failure or relaunch to the commit of the step after it, less
    one step at the world size after it (None: that step was never committed)."""
    if event.regained_time is None:
        return None
    return event.regained_time - event.last_commit_time - event.step_s_after


@dataclass
class Phases:
    """One rank's view of one recovery (Unix seconds, durations in seconds)."""

    rank: int
    detected_time: float
    agree_s: float
    recover_s: float
    rebuild_s: float
    recovered_time: float
    first_commit_time: float | None


@dataclass
class Failure:
    """One failure and its recovery, seen from the reference rank (see the module docstring).

    Times are Unix seconds; ``*_s`` are seconds. ``step`` is the step the failure interrupted
    (counted from 1, as ``--kill RANK@STEP`` and the logs count: the steps before it were
    committed).
    """

    index: int
    step: int
    lost_world_ranks: list
    policy: str
    fallback: str | None
    old_size: int
    new_size: int
    fail_time: float
    fail_time_from: str
    last_commit_time: float
    detected_time: float
    agree_s: float
    recover_s: float
    rebuild_s: float
    recovered_time: float
    first_commit_time: float | None
    regained_time: float | None
    disk_restore: int | None
    redone_steps: int
    bytes_moved: int
    step_s_after: float
    survivors: list = field(default_factory=list)  # Phases of every rank that recovered

    @property
    def pre_failure_s(self) -> float:
        """Work of the interrupted step done before the failure (lost with it)."""
        return max(0.0, self.fail_time - self.last_commit_time)

    @property
    def detection_s(self) -> float:
        """Failure to the error on the reference rank, less the agreement before the error."""
        return max(0.0, self.detected_time - self.agree_s - self.fail_time)

    @property
    def redo_s(self) -> float | None:
        """End of the recovery to the first commit after it (the redone step)."""
        return None if self.first_commit_time is None else self.first_commit_time - self.recovered_time

    @property
    def mttr_s(self) -> float | None:
        """Failure to the first commit after it."""
        return None if self.first_commit_time is None else self.first_commit_time - self.fail_time

    @property
    def lost_s(self) -> float | None:
        """Wall time the failure added to the run (see the module docstring)."""
        return _lost(self)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(pre_failure_s=self.pre_failure_s, detection_s=self.detection_s, redo_s=self.redo_s,
                   mttr_s=self.mttr_s, lost_s=self.lost_s)
        return out


@dataclass
class Relaunch:
    """A relaunch of the whole job, seen from the reference rank (see the module docstring).
    Times are Unix seconds; ``*_s`` are seconds; ``step`` is the step resumed from (None: the
    relaunch found nothing to resume from and started over)."""

    index: int
    death_time: float
    death_time_from: str
    last_commit_time: float
    last_step: int
    start_time: float
    resumed_time: float | None
    step: int | None
    source: str | None
    load_s: float
    old_size: int
    new_size: int
    first_commit_time: float | None
    regained_time: float | None
    step_s_after: float

    @property
    def relaunch_s(self) -> float:
        """Death to the relaunched job's first logged event."""
        return self.start_time - self.death_time

    @property
    def mttr_s(self) -> float | None:
        return None if self.first_commit_time is None else self.first_commit_time - self.death_time

    @property
    def redone_steps(self) -> int:
        return self.last_step - (self.step or 0)

    @property
    def lost_s(self) -> float | None:
        """Wall time the relaunch added to the run, as a failure's."""
        return _lost(self)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(relaunch_s=self.relaunch_s, mttr_s=self.mttr_s, redone_steps=self.redone_steps,
                   lost_s=self.lost_s)
        return out


@dataclass
class RunSummary:
    """A run's numbers (see the module docstring for each definition).

    Attributes:
        run_id, ranks: the run's file prefix and every world rank that logged.
        reference_rank: the world rank whose clock and commits the summary uses.
        initial_size, final_size: world size at the first step and at the end.
        policy, replicas: recovery policy and k, as the driver logged them at start.
        start_time, end_time: Unix seconds of the reference rank's start and last commit.
        wall_s: end_time - start_time.
        steps: distinct steps committed in the run; commits: commits (a step redone after a disk
            fallback commits again).
        step_s, replicate_s: mean step time and mean replication time, by world size.
        failures: one Failure each, in time order.
        redone_steps: step attempts redone after failures.
        lost_s: total wall time added by failures.
        replication_s: time the reference rank spent replicating (sum over its commits).
        checkpoint_s: time the reference rank spent writing disk checkpoints.
        ideal_s: the steps at the first world size without failures and replication.
        goodput: ideal_s / wall_s.
        ended: whether the reference rank logged the end of the run.
        relaunches: one Relaunch each (the whole job died and ftcomm-run brought it back).
    """

    run_id: str
    ranks: list
    reference_rank: int
    initial_size: int
    final_size: int
    policy: str
    replicas: int | None
    start_time: float
    end_time: float
    wall_s: float
    steps: int
    commits: int
    step_s: dict
    replicate_s: dict
    failures: list
    redone_steps: int
    lost_s: float
    replication_s: float
    checkpoint_s: float
    ideal_s: float
    goodput: float
    ended: bool
    relaunches: list = field(default_factory=list)

    @property
    def other_s(self) -> float:
        """Wall time not in the ideal steps, replication, failures or checkpoints (step-time
        noise, slower or faster steps at other world sizes)."""
        return self.wall_s - self.ideal_s - self.replication_s - self.lost_s - self.checkpoint_s

    def as_dict(self) -> dict:
        out = asdict(self)
        out["failures"] = [f.as_dict() for f in self.failures]
        out["relaunches"] = [r.as_dict() for r in self.relaunches]
        out["other_s"] = self.other_s
        out["step_s"] = {str(k): v for k, v in self.step_s.items()}
        out["replicate_s"] = {str(k): v for k, v in self.replicate_s.items()}
        return out


def _reference_rank(run: RunLog) -> int:
    started_at_first = {e["rank"] for e in run.of("start")
                        if e.get("step", 0) == min(s.get("step", 0) for s in run.of("start"))}
    ended = {e["rank"] for e in run.of("end")} & started_at_first
    if ended:
        return min(ended)
    if not started_at_first:
        raise ValueError(f"run {run.run_id!r} in {run.directory}: no 'start' event (logs of an ftcomm "
                         "older than the report, or not the elastic driver's)")
    commits = {r: len(run.of("commit", r)) for r in started_at_first}
    return min(started_at_first, key=lambda r: (-commits[r], r))


def _last_commit_before(commits: list[dict], step: int, recovered_time: float) -> dict | None:
    """The reference rank's commit of ``step``, the last step the survivors say they committed
    before the failure (the one before the step it interrupted). Chosen by step,
    not by comparing its time with the failure's: the victim may log its kill a few milliseconds
    before the reference rank logs that same commit."""
    done = [c for c in commits if c["step"] == step and c["time"] <= recovered_time]
    return done[-1] if done else None


def _steady_intervals(commits: list[dict], excluded: list[float]) -> dict[int, list[tuple[float, float]]]:
    """(interval, replicate_s) of consecutive commits by world size, without warm-up steps and
    without an interval that has one of the ``excluded`` times in it (failures, checkpoints)."""
    out: dict[int, list[tuple[float, float]]] = {}
    first_step = commits[0]["step"] if commits else 0
    for prev, cur in zip(commits, commits[1:]):
        if cur["step"] != prev["step"] + 1 or cur["step"] - first_step < WARMUP_STEPS:
            continue
        if cur.get("world_size") != prev.get("world_size"):
            continue
        if any(prev["time"] < t <= cur["time"] for t in excluded):
            continue
        out.setdefault(cur["world_size"], []).append((cur["time"] - prev["time"], cur.get("replicate_s", 0.0)))
    return out


def _relaunches(run: RunLog, ref: int, commits: list[dict]) -> list[tuple]:
    """(death time, its source, the old launch's last commit, the new launch's start event, its
    resumed event or None) of each later ``start`` of the reference rank."""
    starts = run.of("start", ref)
    out = []
    for new in starts[1:]:
        before = [e for e in run.events if e["time"] < new["time"]]
        old_commits = [c for c in commits if c["time"] < new["time"]]
        kills = [e for e in before if e["event"] == "kill"]
        if kills:
            death, source = kills[-1]["time"], "kill event"
        else:
            death, source = before[-1]["time"], "the old launch's last event"
        resumed = next((e for e in run.of("resumed", ref) if e["time"] >= new["time"]), None)
        out.append((death, source, old_commits[-1] if old_commits else None, new, resumed))
    return out


def summarize(run: RunLog) -> RunSummary:
    """The run's summary (module docstring).

    Raises:
        ValueError: the logs have no ``start`` or no ``commit`` event (not written by the elastic
            driver of this version), or a failure without any survivor's ``recovered`` event.
    """
    ref = _reference_rank(run)
    start = run.of("start", ref)[0]
    commits = run.of("commit", ref)
    if not commits:
        raise ValueError(f"run {run.run_id!r}: world rank {ref} committed no step")
    groups: dict[tuple, list[dict]] = {}
    for e in run.of("recovered"):
        groups.setdefault((e["step"], tuple(e["lost_world_ranks"])), []).append(e)
    kills = run.of("kill")
    raw = []
    for (step, lost), events in groups.items():
        matched = [k for k in kills if k["rank"] in lost and k.get("step") == step]
        if matched:
            fail_time, source = min(k["time"] for k in matched), "kill event"
        else:
            fail_time = min(e["detected_time"] - (e.get("detection_s") or 0.0) for e in events)
            source = "failed phase start"
        raw.append((fail_time, source, step, lost, events))
    raw.sort(key=lambda r: r[0])
    relaunched = _relaunches(run, ref, commits)
    intervals = _steady_intervals(commits, [r[0] for r in raw] + [r[3]["time"] for r in relaunched]
                                  + [e["time"] for e in run.of("checkpoint", ref)])
    step_s = {n: statistics.fmean(v for v, _ in xs) for n, xs in sorted(intervals.items())}
    replicate_s = {n: statistics.fmean(r for _, r in xs) for n, xs in sorted(intervals.items())}
    initial = start["world_size"]
    if initial not in step_s:
        raise ValueError(f"run {run.run_id!r}: no steady step at the first world size {initial} "
                         f"(fewer than {WARMUP_STEPS + 2} steps before the first failure?)")

    failures = []
    for index, (fail_time, source, step, lost, events) in enumerate(raw):
        mine = next((e for e in events if e["rank"] == ref), None)
        if mine is None:
            raise ValueError(f"run {run.run_id!r}: world rank {ref} logged no recovery from the failure "
                             f"at step {step} (lost {list(lost)})")
        by_step = None if mine.get("disk_restore") is not None else _last_commit_before(commits, step - 1, mine["time"])
        last_commit = by_step or next((c for c in reversed(commits) if c["time"] < fail_time), start)
        pre_step = last_commit.get("step", start["step"])
        after = [c for c in commits if c["time"] > mine["time"]]
        first_commit = after[0]["time"] if after else None
        regained = next((c["time"] for c in after if c["step"] == pre_step + 1), None)
        new_size = mine["new_size"]
        survivors = []
        for e in sorted(events, key=lambda e: e["rank"]):
            nxt = next((c["time"] for c in run.of("commit", e["rank"]) if c["time"] > e["time"]), None)
            survivors.append(Phases(e["rank"], e["detected_time"], e.get("agree_s") or 0.0,
                                    e.get("recover_s") or 0.0, e.get("rebuild_s") or 0.0, e["time"], nxt))
        disk = mine.get("disk_restore")
        failures.append(Failure(
            index=index, step=pre_step + 1, lost_world_ranks=list(lost), policy=mine.get("policy", ""),
            fallback=mine.get("fallback"), old_size=mine["old_size"], new_size=new_size, fail_time=fail_time,
            fail_time_from=source, last_commit_time=last_commit["time"], detected_time=mine["detected_time"],
            agree_s=mine.get("agree_s") or 0.0, recover_s=mine.get("recover_s") or 0.0,
            rebuild_s=mine.get("rebuild_s") or 0.0, recovered_time=mine["time"], first_commit_time=first_commit,
            regained_time=regained, disk_restore=disk,
            redone_steps=1 if disk is None else pre_step - disk + 1, bytes_moved=mine.get("bytes_moved", 0),
            step_s_after=step_s.get(new_size, step_s[initial]), survivors=survivors))

    relaunches = []
    for index, (death, source, last, new, resumed) in enumerate(relaunched):
        last = last or start
        after = [c for c in commits if c["time"] > new["time"]]
        new_size = after[0]["world_size"] if after else new.get("world_size", initial)
        relaunches.append(Relaunch(
            index=index, death_time=death, death_time_from=source, last_commit_time=last["time"],
            last_step=last.get("step", 0), start_time=new["time"], resumed_time=resumed and resumed["time"],
            step=resumed and resumed["step"], source=resumed and resumed.get("from"),
            load_s=(resumed or {}).get("load_s", 0.0), old_size=last.get("world_size", initial), new_size=new_size,
            first_commit_time=after[0]["time"] if after else None,
            regained_time=next((c["time"] for c in after if c["step"] == last.get("step", 0) + 1), None),
            step_s_after=step_s.get(new_size, step_s[initial])))

    steps = max(c["step"] for c in commits) - start["step"]
    t_ideal = step_s[initial] - replicate_s[initial]
    end_time = commits[-1]["time"]
    wall = end_time - start["time"]
    # what the training waited for: the staging stall of an asynchronous checkpoint (the write runs
    # beside training), the whole save of a synchronous one
    ckpt = sum(e.get("stall_s", e.get("seconds", 0.0)) for e in run.of("checkpoint", ref))
    lost = sum(f.lost_s for f in failures + relaunches if f.lost_s is not None)
    final = run.of("end", ref)
    return RunSummary(
        run_id=run.run_id, ranks=run.ranks, reference_rank=ref, initial_size=initial,
        final_size=final[-1]["world_size"] if final else commits[-1]["world_size"],
        policy=start.get("policy") or "", replicas=start.get("replicas"), start_time=start["time"],
        end_time=end_time, wall_s=wall, steps=steps, commits=len(commits), step_s=step_s,
        replicate_s=replicate_s, failures=failures, redone_steps=sum(f.redone_steps for f in failures),
        lost_s=lost, replication_s=sum(c.get("replicate_s", 0.0) for c in commits), checkpoint_s=ckpt,
        ideal_s=steps * t_ideal, goodput=steps * t_ideal / wall if wall > 0 else float("nan"), ended=bool(final),
        relaunches=relaunches)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def costs(summary: RunSummary) -> dict:
    """The run's measured costs in benchmarks/mttr.py's JSON layout, which ``ftcomm-goodput
    --costs`` reads: ``steady`` (step_s, replicate_s, replication_overhead at the first world
    size), ``memory`` (shrink) and ``memory_spares`` (spares) with the mean of each phase over
    the in-memory recoveries of that policy, ``disk_fallback`` for recoveries from disk, and
    ``pre_failure_s``, the mean work of the interrupted step done before a failure."""
    n = summary.initial_size
    entry = {"size": "run", "steady": {"step_s": summary.step_s[n], "replicate_s": summary.replicate_s[n],
                                       "replication_overhead": summary.replicate_s[n] / summary.step_s[n]}}
    for key, chosen in (("memory", [f for f in summary.failures if f.disk_restore is None and f.policy != "spares"]),
                        ("memory_spares", [f for f in summary.failures if f.disk_restore is None and f.policy == "spares"]),
                        ("disk_fallback", [f for f in summary.failures if f.disk_restore is not None])):
        if chosen:
            entry[key] = {"failures": len(chosen), "mttr_s": _mean(f.mttr_s for f in chosen),
                          "detection_s": _mean(f.detection_s for f in chosen),
                          "agree_shrink_s": _mean(f.agree_s + f.recover_s for f in chosen),
                          "rebuild_s": _mean(f.rebuild_s for f in chosen), "redo_s": _mean(f.redo_s for f in chosen),
                          "pre_failure_s": _mean(f.pre_failure_s for f in chosen),
                          "lost_s": _mean(f.lost_s for f in chosen)}
    return {"source": "ftcomm-report", "run": summary.run_id, "ranks": n, "policy": summary.policy,
            "replicas": summary.replicas, "results": [entry],
            "run_summary": {"steps": summary.steps, "failures": len(summary.failures), "wall_s": summary.wall_s,
                            "goodput": summary.goodput, "final_size": summary.final_size}}


def format_summary(summary: RunSummary) -> str:
    """The summary as text (what ``ftcomm-report`` prints)."""
    ms = lambda s: "-" if s is None else f"{s * 1e3:.1f}"  # noqa: E731
    lines = [
        f"run {summary.run_id.rstrip('.') or '(no prefix)'}: world ranks {summary.ranks}, reference rank {summary.reference_rank}",
        f"  world size {summary.initial_size} -> {summary.final_size}, policy {summary.policy or 'default'}, "
        + (f"k={summary.replicas}" if summary.replicas is not None else "no replicas logged")
        + f", {summary.steps} steps in {summary.wall_s:.3f} s"
        + ("" if summary.ended else " (the reference rank logged no end: the run did not finish)"),
        "  step time by world size: " + ", ".join(f"{n}: {t * 1e3:.2f} ms (replication {summary.replicate_s[n] * 1e3:.2f} ms)"
                                                   for n, t in summary.step_s.items()),
        f"  failures: {len(summary.failures)}, steps redone: {summary.redone_steps}",
    ]
    if summary.failures:
        lines.append("   #  step  lost ranks   size   MTTR ms  detect ms  agree ms  shrink ms  rebuild ms  redo ms  lost ms  failure time from")
    for f in summary.failures:
        lines.append(f"  {f.index:2d} {f.step:5d}  {str(f.lost_world_ranks):<11} {f.old_size:>2}->{f.new_size:<2} "
                     f"{ms(f.mttr_s):>8} {ms(f.detection_s):>10} {ms(f.agree_s):>9} {ms(f.recover_s):>10} "
                     f"{ms(f.rebuild_s):>11} {ms(f.redo_s):>8} {ms(f.lost_s):>8}  {f.fail_time_from}"
                     + (f", disk restore of step {f.disk_restore}" if f.disk_restore is not None else ""))
    if summary.relaunches:
        lines.append(f"  relaunches: {len(summary.relaunches)} (the whole job died; ftcomm-run brought it back)")
        lines.append("   #  died after step  size   resumed from        MTTR s  relaunch s  load s  redo s  "
                     "steps redone  lost s  death time from")
    for r in summary.relaunches:
        resumed = "nothing" if r.step is None else f"step {r.step} ({r.source})"
        redo = None if r.first_commit_time is None or r.resumed_time is None else r.first_commit_time - r.resumed_time
        sec = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"  {r.index:2d} {r.last_step:>16}  {r.old_size:>2}->{r.new_size:<2} {resumed:<18} "
                     f"{sec(r.mttr_s):>7} {sec(r.relaunch_s):>11} {sec(r.load_s):>7} {sec(redo):>7} "
                     f"{r.redone_steps:>13} {sec(r.lost_s):>7}  {r.death_time_from}")
    lines += [
        f"  wall {summary.wall_s:.3f} s = ideal steps {summary.ideal_s:.3f} + replication {summary.replication_s:.3f}"
        f" + failures{' and relaunches' if summary.relaunches else ''} {summary.lost_s:.3f} + checkpoints {summary.checkpoint_s:.3f} + other {summary.other_s:.3f}",
        f"  goodput {summary.goodput:.4f} (ideal step time x steps / wall)",
    ]
    lines += _why_over_ideal(summary)
    return "\n".join(lines)


def _why_over_ideal(summary: RunSummary) -> list[str]:
    """A line saying why goodput is above 1 or "other" negative, when they are: the ideal counts
    every step at the first world size's step time, and steps at another size ran faster."""
    if not (summary.goodput > 1 or summary.other_s < 0):
        return []
    first = summary.step_s[summary.initial_size]
    faster = {n: t for n, t in summary.step_s.items() if t < first}
    if not faster:
        return ["  (other < 0: the run's steps were faster than their mean, which the ideal uses: step-time noise)"]
    sizes = ", ".join(f"{t * 1e3:.2f} ms at world size {n}" for n, t in faster.items())
    return [f"  (goodput above 1 / other < 0: the ideal counts every step at world size {summary.initial_size}'s "
            f"{first * 1e3:.2f} ms, and steps ran faster after the world changed: {sizes})"]
