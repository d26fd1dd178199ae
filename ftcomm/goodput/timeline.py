"""The recovery timeline picture of one run (``ftcomm-report``), drawn with matplotlib.

Top: one row per world rank, a tick per committed step, each failure's phases on every survivor
(detection, agreement, shrink or spare round, rebuild, redo) and a cross where a rank died.
Middle: world size and committed step over time. Bottom: one zoomed panel per failure (the
first four). The x axis is seconds since the reference rank's start.
"""
from __future__ import annotations

from .logs import RunLog
from .summary import RunSummary

COLORS = {"detection": "tab:red", "agreement": "tab:orange", "shrink / spare round": "gold",
          "rebuild": "tab:green", "disk restore": "tab:purple", "redo": "tab:blue",
          "relaunch": "0.35", "resume from memory": "tab:cyan", "resume from disk": "tab:purple"}
MAX_ZOOMS = 4


def require_matplotlib():
    """Imports matplotlib with the Agg backend and returns pyplot.

    Raises:
        ImportError: matplotlib is not installed, with the install command in the message.
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError("drawing needs matplotlib: pip install 'ftcomm[bench]' (or matplotlib>=3.7)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _segments(failure, phases):
    """(label, start, end) in Unix seconds of one survivor's phases of one failure."""
    detect_end = phases.detected_time - phases.agree_s
    out = [("detection", failure.fail_time, detect_end), ("agreement", detect_end, phases.detected_time),
           ("shrink / spare round", phases.detected_time, phases.detected_time + phases.recover_s)]
    rebuild_start = phases.detected_time + phases.recover_s
    label = "rebuild" if failure.disk_restore is None else "disk restore"
    out.append((label, rebuild_start, max(rebuild_start, phases.recovered_time)))
    if phases.first_commit_time is not None:
        out.append(("redo", phases.recovered_time, phases.first_commit_time))
    return [(k, a, b) for k, a, b in out if b > a]


def _draw_ranks(ax, run: RunLog, summary: RunSummary, t0: float, rows: dict, zoom=None):
    for rank, y in rows.items():
        events = [e for e in run.events if e["rank"] == rank]
        if not events:
            continue
        ax.plot([events[0]["time"] - t0, events[-1]["time"] - t0], [y, y], color="0.85", lw=1, zorder=1)
        commits = [e["time"] - t0 for e in events if e["event"] == "commit"]
        ax.plot(commits, [y] * len(commits), "|", color="0.45", ms=7, zorder=2)
        for e in events:
            if e["event"] == "joined":
                ax.plot(e["time"] - t0, y, "o", color="tab:green", ms=6, zorder=4)
    for f in summary.failures:
        for rank in f.lost_world_ranks:
            if rank in rows:
                ax.plot(f.fail_time - t0, rows[rank], "x", color="tab:red", ms=9, mew=2, zorder=5)
        for phases in f.survivors:
            for label, a, b in _segments(f, phases):
                ax.barh(rows[phases.rank], b - a, left=a - t0, height=0.5, color=COLORS[label], label=label, zorder=3)
    for r in summary.relaunches:  # the ranks that logged their end (a node crash), then the job down
        for e in run.of("kill"):
            if r.last_commit_time - 1.0 <= e["time"] <= r.start_time and e["rank"] in rows:
                ax.plot(e["time"] - t0, rows[e["rank"]], "x", color="tab:red", ms=9, mew=2, zorder=5)
        spans = [("relaunch", r.death_time, r.start_time)]
        if r.resumed_time is not None:
            spans.append((f"resume from {r.source or 'disk'}", r.resumed_time - r.load_s, r.resumed_time))
            if r.first_commit_time is not None:
                spans.append(("redo", r.resumed_time, r.first_commit_time))
        # the whole job was down: a band across every rank
        for label, a, b in spans:
            if b > a:
                ax.axvspan(a - t0, b - t0, color=COLORS[label], alpha=0.35, label=label, zorder=0)
    ax.set_yticks(list(rows.values()), [f"rank {r}" for r in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    if zoom is not None:
        ax.set_xlim(*zoom)


def draw(run: RunLog, summary: RunSummary, path) -> None:
    """Writes the timeline PNG of ``run`` to ``path``.

    Raises:
        ImportError: no matplotlib (``require_matplotlib``).
    """
    plt = require_matplotlib()
    fig = figure(run, summary)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(run: RunLog, summary: RunSummary):
    """The timeline of ``run`` as a matplotlib Figure (laid out, not saved).

    Raises:
        ImportError: no matplotlib (``require_matplotlib``).
    """
    plt = require_matplotlib()
    t0 = summary.start_time
    rows = {rank: i for i, rank in enumerate(summary.ranks)}
    zooms = summary.failures[:MAX_ZOOMS]
    height = 1.2 + 0.32 * len(rows) + 2.2 + (2.2 if zooms else 0)
    fig = plt.figure(figsize=(12, height))
    grid = fig.add_gridspec(3 if zooms else 2, max(1, len(zooms)),
                            height_ratios=[0.32 * len(rows) + 0.6, 2.0] + ([2.0] if zooms else []))
    ax = fig.add_subplot(grid[0, :])
    _draw_ranks(ax, run, summary, t0, rows)
    relaunched = f", {len(summary.relaunches)} relaunch(es)" if summary.relaunches else ""
    ax.set_title(f"run {summary.run_id.rstrip('.') or '(no prefix)'}: {summary.steps} steps, {len(summary.failures)} failure(s){relaunched}, "
                 f"world size {summary.initial_size} -> {summary.final_size}, goodput {summary.goodput:.3f}")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    from matplotlib.lines import Line2D

    if summary.failures or run.of("kill"):
        unique["rank died"] = Line2D([], [], marker="x", color="tab:red", ls="", mew=2)
    if run.of("joined"):
        unique["spare joined"] = Line2D([], [], marker="o", color="tab:green", ls="")
    unique["committed step"] = Line2D([], [], marker="|", color="0.45", ls="", ms=8)

    size_ax = fig.add_subplot(grid[1, :], sharex=ax)
    commits = run.of("commit", summary.reference_rank)
    times = [summary.start_time - t0] + [c["time"] - t0 for c in commits]
    sizes = [summary.initial_size] + [c["world_size"] for c in commits]
    size_ax.step(times, sizes, where="post", color="tab:gray", label="world size")
    size_ax.set_ylabel("world size")
    size_ax.set_ylim(0, max(sizes) + 1)
    step_ax = size_ax.twinx()
    step_ax.plot([c["time"] - t0 for c in commits], [c["step"] for c in commits], color="tab:blue", lw=1)
    step_ax.set_ylabel("committed step", color="tab:blue")
    for f in summary.failures:
        size_ax.axvline(f.fail_time - t0, color="tab:red", ls=":", lw=1)
    for r in summary.relaunches:
        size_ax.axvspan(r.death_time - t0, r.start_time - t0, color=COLORS["relaunch"], alpha=0.25)
    x_label = f"seconds since the start of world rank {summary.reference_rank}"
    size_ax.set_xlabel(x_label)
    # Beside the panels, not over them: tight_layout narrows the axes to make room.
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)

    for i, f in enumerate(zooms):
        zax = fig.add_subplot(grid[2, i])
        end = max([f.regained_time or f.recovered_time] + [p.first_commit_time or p.recovered_time for p in f.survivors])
        pad = 0.5 * f.step_s_after
        _draw_ranks(zax, run, summary, t0, rows, zoom=(f.last_commit_time - t0 - pad, end - t0 + pad))
        zax.set_title(f"step {f.step}: lost {f.lost_world_ranks}, MTTR "
                      + ("-" if f.mttr_s is None else f"{f.mttr_s * 1e3:.0f} ms"), fontsize=9)
        zax.tick_params(labelsize=7)
        zax.set_xlabel(x_label, fontsize=7)
        if i:
            zax.set_yticklabels([])
    fig.tight_layout()
    return fig
