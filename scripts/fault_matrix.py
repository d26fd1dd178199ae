"""The fault matrix: every protocol phase x every failure kind, plus cascades, at 4 ranks.

Each cell is one ftcomm-run job (tests/jobs/matrix_*.py) under a hard timeout. The table says, per
cell: outcome, detection ms (start of the failing phase to the exception, slowest survivor),
recovery ms (exception to the redo's commit for allreduce cells; shrink + rebuild + agreement
for training cells; the group's recovery for DDP cells, whose detection runs from the start of the
failing iteration), steps redone, and the state check (survivors bitwise equal to the
reference, every committed step applied exactly once). JSON goes to results/fault_matrix-*.json.

    python scripts/fault_matrix.py                      # the whole matrix, once
    python scripts/fault_matrix.py --repeat 10          # ten repetitions of every cell
    python scripts/fault_matrix.py --only hang --list   # cells whose name contains "hang"

FTCOMM_TIMEOUT (seconds, default here 5) bounds each call and is the fence timeout: a hung or
stopped rank is detected about that long after its last sign of life.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from harness import JOBS, run_job  # noqa: E402

N = 4
KINDS = ("kill", "exit", "hang", "stop")
RECOVERED_RC = 3  # --recovered-exit-code of every job, so that the exit status is checked too


@dataclass
class Cell:
    name: str
    job: str  # "allreduce", "train" or "ddp"
    fault: str  # FTCOMM_FAULT
    lost: list  # world ranks expected to be lost
    args: list = field(default_factory=list)
    expect: str = "recovered"  # "recovered", "state_lost", "failed"


def _allreduce_points():
    # (point, extra keys): step 2 of 6; ring positions inside the 3-chunk segments of 10,007 floats
    return [("before", ""), ("reduce_scatter", ",ring_step=1,chunk=1"),
            ("allgather", ",ring_step=2,chunk=2"), ("commit", "")]


def cells() -> list[Cell]:
    """The whole matrix: 16 allreduce cells, 20 training cells, 6 DDP step-commit cells, 8 cascades."""
    out = []
    for point, extra in _allreduce_points():
        for kind in KINDS:
            out.append(Cell(f"allreduce-{point}-{kind}", "allreduce",
                            f"rank=2,point={point},step=2{extra},kind={kind}", [2]))
    first_kill = "rank=3,point=train_step,step=4,kind=kill"
    for kind in KINDS:
        out += [
            Cell(f"train-train_step-{kind}", "train", f"rank=2,point=train_step,step=4,kind={kind}", [2]),
            Cell(f"train-shard_update-{kind}", "train", f"rank=1,point=shard_update,step=4,kind={kind}", [1]),
            Cell(f"train-replicate-{kind}", "train", f"rank=2,point=replicate,step=4,kind={kind}", [2]),
            # a second failure during the recovery from a first one
            Cell(f"train-shrink-{kind}", "train", f"{first_kill};rank=1,point=shrink,step=4,kind={kind}", [1, 3]),
            Cell(f"train-rebuild-{kind}", "train", f"{first_kill};rank=1,point=rebuild,step=3,kind={kind}", [1, 3]),
        ]
    # DDP, several buckets per step, committed by one agreement per step: a failure in a bucket's
    # allreduce (allreduce step 11, a second bucket of its training step) with every kind, and a
    # kill just before the step agreement
    for kind in KINDS:
        out.append(Cell(f"ddp-allgather-{kind}", "ddp", f"rank=2,point=allgather,step=11,ring_step=1,chunk=0,kind={kind}",
                        [2]))
    out.append(Cell("ddp-step_commit-kill", "ddp", "rank=1,point=step_commit,step=11,kind=kill", [1]))
    # the same kill with a user allreduce of the loss between backward and the optimizer step: it
    # commits on its own, finds the failure first, and the step agreement is skipped
    out.append(Cell("ddp-allgather-kill-loss", "ddp", "rank=2,point=allgather,step=11,ring_step=1,chunk=0,kind=kill",
                    [2], ["--loss-allreduce"]))
    out += [
        Cell("cascade-two-at-once", "allreduce",
             "rank=1,point=allgather,step=2,kind=kill;rank=3,point=allgather,step=2,kind=kill", [1, 3]),
        Cell("cascade-hang-and-kill", "allreduce",
             "rank=1,point=before,step=2,kind=hang;rank=3,point=reduce_scatter,step=2,kind=kill", [1, 3]),
        Cell("cascade-rank0", "allreduce", "rank=0,point=reduce_scatter,step=2,ring_step=0,chunk=0,kind=kill", [0]),
        Cell("cascade-down-to-one", "allreduce",
             "rank=3,point=before,step=1,kind=kill;rank=2,point=allgather,step=2,kind=stop;"
             "rank=1,point=commit,step=3,kind=exit", [1, 2, 3]),
        Cell("cascade-train-down-to-one", "train",
             "rank=3,point=train_step,step=2,kind=kill;rank=1,point=train_step,step=4,kind=hang;"
             "rank=2,point=replicate,step=6,kind=kill", [1, 2, 3], ["--replicas", "1"]),
        Cell("cascade-buddies-state-lost", "train",
             "rank=1,point=train_step,step=4,kind=kill;rank=2,point=train_step,step=4,kind=kill", [1, 2],
             expect="state_lost"),
        Cell("cascade-buddies-disk", "train",
             "rank=1,point=train_step,step=5,kind=kill;rank=2,point=train_step,step=5,kind=stop", [1, 2],
             ["--checkpoint-every", "2", "--checkpoint-dir", "{tmp}"]),
        Cell("failed-run-exit-status", "allreduce", "rank=2,point=allgather,step=2,kind=kill", [2],
             ["--no-recover"], expect="failed"),
    ]
    return out


@dataclass
class Row:
    scenario: str
    outcome: str
    detection_ms: float | None = None
    recovery_ms: float | None = None
    steps_redone: int | None = None
    state_check: str = "-"
    rc: int | None = None
    seconds: float = 0.0
    problems: list = field(default_factory=list)


def run_cell(cell: Cell, timeout_s: float = 120.0, env: dict | None = None, tmp: str | None = None) -> Row:
    """Runs one cell and checks it. Returns the table row (``outcome`` "ok" when every check held)."""
    import tempfile

    tmp = tmp or tempfile.mkdtemp(prefix="ftcomm-matrix-")
    args = [a.replace("{tmp}", tmp) for a in cell.args]
    job_env = {"FTCOMM_TIMEOUT": "5", "FTCOMM_FAULT": cell.fault, **(env or {})}
    t0 = time.monotonic()
    res = run_job(JOBS / f"matrix_{cell.job}.py", N, *args, env=job_env, timeout=timeout_s,
                  launcher_args=["--recovered-exit-code", str(RECOVERED_RC)])
    row = Row(cell.name, "ok", rc=res.returncode, seconds=round(time.monotonic() - t0, 1))
    survivors = [r for r in range(N) if r not in cell.lost]
    check = {"allreduce": _check_allreduce, "train": _check_train, "ddp": _check_ddp}[cell.job]
    try:
        check(cell, res, survivors, row)
    except AssertionError as exc:
        row.problems.append(str(exc) or "assertion failed")
    if row.problems:
        row.outcome = "FAIL"
        row.problems.append(res.describe()[-3000:])
    return row


def _expect(cond, message):
    if not cond:
        raise AssertionError(message)


def _check_allreduce(cell, res, survivors, row):
    if cell.expect == "failed":
        _expect(res.returncode not in (0, RECOVERED_RC, 124), f"failed run exited {res.returncode}")
        row.state_check, row.outcome = "n/a", "ok"
        return
    _expect(res.returncode == RECOVERED_RC, f"exit status {res.returncode}, expected {RECOVERED_RC}")
    done = res.by_rank(event="done")
    _expect(sorted(done) == survivors, f"survivors {sorted(done)}, expected {survivors}")
    reps = list(done.values())
    errors = [[(e["type"], e["step"], e["failed"]) for e in r["errors"]] for r in reps]
    _expect(all(e == errors[0] for e in errors), f"survivors saw different errors: {errors}")
    lost = sorted({w for e in errors[0] for w in e[2]})
    _expect(lost == sorted(cell.lost), f"failed ranks {lost}, expected {cell.lost}")
    _expect(all(t == "ProcFailedError" for t, _, _ in errors[0]), f"error types {errors[0]}")
    _expect(all(e["unchanged"] for r in reps for e in r["errors"]), "a buffer changed by an aborted step")
    steps = [sorted(map(int, r["members"])) for r in reps]
    _expect(all(s == list(range(6)) for s in steps), f"committed steps {steps}")
    _expect(all(r["last_committed"] == 5 and r["size"] == len(survivors) for r in reps), "ledger or size")
    _expect(all(r["state_ok"] for r in reps), "accumulated state differs from the reference")
    _expect(len({r["digest"] for r in reps}) == 1, "survivors' states differ")
    row.state_check = "bitwise"
    row.detection_ms = max(r["errors"][0]["detection_ms"] for r in reps)
    row.recovery_ms = max(max(r["recovery_ms"]) for r in reps)
    row.steps_redone = len(errors[0])


def _check_train(cell, res, survivors, row):
    _expect(res.returncode == RECOVERED_RC, f"exit status {res.returncode}, expected {RECOVERED_RC}")
    if cell.expect == "state_lost":
        lost = res.by_rank(event="state_lost")
        _expect(sorted(lost) == survivors, f"state_lost on {sorted(lost)}, expected {survivors}")
        _expect(len({tuple(r["lost_shards"]) for r in lost.values()}) == 1, "lost shards differ")
        row.state_check = f"StateLostError {next(iter(lost.values()))['lost_shards']}"
        return
    done = res.by_rank(event="done")
    _expect(sorted(done) == survivors, f"survivors {sorted(done)}, expected {survivors}")
    _expect(all(d["steps"] == 8 and d["size"] == len(survivors) for d in done.values()), f"done {done}")
    _expect(len({d["param_crc"] for d in done.values()}) == 1, "survivors' final models differ")
    for w in survivors:  # each committed step exactly once per survivor (disk restore redoes some)
        used = [r["step"] for r in res.reports if r["event"] == "used" and r["world_rank"] == w]
        recovered = [r for r in res.reports if r["event"] == "recovered" and r["world_rank"] == w]
        disk = [r["disk_restore"] for r in recovered if r["disk_restore"] is not None]
        expected = list(range(1, 9))
        if disk:
            _expect(len(disk) == 1, f"rank {w}: several disk restores")
            # the steps committed before the failure, then from the checkpoint's step on again: the
            # newest checkpoint complete at the failure may be older than the last committed step
            # (written in the background), and the steps since it are then committed twice
            drop = next((i for i in range(1, len(used)) if used[i] <= used[i - 1]), None)
            first = drop if drop is not None else (used.index(disk[0] + 1) if disk[0] + 1 in used else len(used))
            _expect(used[:first] == list(range(1, first + 1)) and disk[0] <= first, f"rank {w} steps {used}")
            expected = used[:first] + list(range(disk[0] + 1, 9))
        _expect(used == expected, f"rank {w} committed steps {used}, expected {expected}")
    rec = [r for r in res.reports if r["event"] == "recovered"]
    failed = sorted({w for r in rec for w in r["failed"]})
    _expect(failed == sorted(cell.lost), f"recovered from {failed}, expected {cell.lost}")
    in_memory = [r for r in rec if r["disk_restore"] is None]
    _expect(all(r["equal"] and r["params_equal"] for r in in_memory), "rebuilt state differs from the snapshot")
    row.state_check = "bitwise" + (" + disk" if len(in_memory) < len(rec) else "")
    row.detection_ms = max(r["detection_ms"] for r in rec)
    row.recovery_ms = max(r["recovery_ms"] for r in rec)
    row.steps_redone = max(d["redone"] for d in done.values())


def _check_ddp(cell, res, survivors, row):
    """Survivors: the same parameters and averaged loss after every iteration and the same parameters at
    the end, a voided iteration left them bitwise as before it, the recovery names the lost rank, the same applied and redone counts."""
    _expect(res.returncode == RECOVERED_RC, f"exit status {res.returncode}, expected {RECOVERED_RC}")
    done = res.by_rank(event="done")
    _expect(sorted(done) == survivors, f"survivors {sorted(done)}, expected {survivors}")
    reps = list(done.values())
    _expect(len({r["digest"] for r in reps}) == 1, "survivors' final parameters differ")
    _expect(len({(r["applied"], r["redone"]) for r in reps}) == 1, f"applied/redone differ: {done}")
    _expect(all(r["size"] == len(survivors) for r in reps), "world size after the recovery")
    lost = sorted({w for r in reps for e in r["recoveries"] for w in e[0]})
    _expect(lost == sorted(cell.lost), f"recovered from {lost}, expected {cell.lost}")
    iters = [r for r in res.reports if r.get("event") == "iter" and r["world_rank"] in survivors]
    by_it: dict = {}
    for r in iters:
        by_it.setdefault(r["it"], set()).add((r["skipped"], r["after"], r["loss"]))
    _expect(all(len(v) == 1 for v in by_it.values()), "survivors differ after an iteration (parameters or loss)")
    voided = [r for r in iters if r["skipped"]]
    _expect(all(r["after"] == r["before"] for r in voided), "a voided step changed the parameters")
    row.state_check = "bitwise"
    row.recovery_ms = max(e[2] for r in reps for e in r["recoveries"]) * 1e3
    row.detection_ms = max(e[3] for r in reps for e in r["recoveries"]) * 1e3
    row.steps_redone = reps[0]["redone"]


def _fmt(v):
    return "-" if v is None else (f"{v:,.0f}" if isinstance(v, float) else str(v))


def print_table(rows):
    head = ("scenario", "outcome", "detection ms", "recovery ms", "steps redone", "state check", "rc", "s")
    table = [head] + [(r.scenario, r.outcome, _fmt(r.detection_ms), _fmt(r.recovery_ms), _fmt(r.steps_redone),
                       r.state_check, _fmt(r.rc), _fmt(r.seconds)) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_summary(rows) -> None:
    """One line per scenario over its repetitions: runs ok, detection and recovery ms as median
    (max), most steps redone, the state checks seen."""
    by_name: dict = {}
    for r in rows:
        by_name.setdefault(r.scenario, []).append(r)

    def med_max(values):
        values = sorted(v for v in values if v is not None)
        return "-" if not values else f"{_fmt(statistics.median(values))} ({_fmt(max(values))})"

    head = ("scenario", "ok", "detection ms median (max)", "recovery ms median (max)", "steps redone", "state check")
    table = [head]
    for name, runs in by_name.items():
        table.append((name, f"{sum(r.outcome == 'ok' for r in runs)}/{len(runs)}",
                      med_max(r.detection_ms for r in runs), med_max(r.recovery_ms for r in runs),
                      _fmt(max((r.steps_redone for r in runs if r.steps_redone is not None), default=None)),
                      ", ".join(sorted({r.state_check for r in runs}))))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1, help="repetitions of every cell (default 1)")
    p.add_argument("--only", action="append", default=[], help="run cells whose name contains this (repeatable)")
    p.add_argument("--timeout", type=float, default=120.0, help="hard timeout per job, seconds (default 120)")
    p.add_argument("--fence-timeout", type=float, default=5.0,
                   help="FTCOMM_TIMEOUT for the jobs, seconds (default 5): the hang detection time")
    p.add_argument("--list", action="store_true", help="list the cells and exit")
    p.add_argument("--summarize", metavar="JSON", help="print the per-scenario summary of an earlier run and exit")
    p.add_argument("--out", default=str(REPO / "results"), help="directory for the JSON (default results/)")
    args = p.parse_args(argv)
    if args.summarize:
        print_summary([Row(**r) for r in json.loads(Path(args.summarize).read_text())["rows"]])
        return 0
    chosen = [c for c in cells() if not args.only or any(o in c.name for o in args.only)]
    if args.list:
        for c in chosen:
            print(f"{c.name:32s} {c.fault}")
        return 0
    rows = []
    for rep in range(args.repeat):
        for cell in chosen:
            row = run_cell(cell, args.timeout, env={"FTCOMM_TIMEOUT": str(args.fence_timeout)})
            rows.append(row)
            print(f"[{rep + 1}/{args.repeat}] {row.scenario}: {row.outcome} ({row.seconds} s)", flush=True)
            for problem in row.problems[:-1]:
                print("   ", problem, flush=True)
    print()
    print_table(rows)
    if args.repeat > 1:
        print()
        print_summary(rows)
    failures = [r for r in rows if r.outcome != "ok"]
    print(f"\n{len(rows) - len(failures)} of {len(rows)} cells ok ({args.repeat} repetition(s))")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fault_matrix-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"repeat": args.repeat, "fence_timeout_s": args.fence_timeout,
                                "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
