"""ftcomm-report on synthetic event logs whose every number is known: the summary, the costs it
hands to ftcomm-goodput, the picture, and its errors."""
import json
import os
import sys

import pytest

from ftcomm.goodput import report_cli
from ftcomm.goodput.inputs import Costs
from ftcomm.goodput.logs import find_runs, load_run, read_jsonl
from ftcomm.goodput.summary import costs, format_summary, summarize

T0 = 1000.0
approx = lambda v: pytest.approx(v, abs=1e-9)  # noqa: E731


def _write(directory, prefix, events):
    by_rank = {}
    for e in events:
        by_rank.setdefault(e["rank"], []).append(e)
    for rank, evs in by_rank.items():
        with open(directory / f"{prefix}rank{rank}.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in sorted(evs, key=lambda e: e["time"]))


def _recovered(rank, time, detected, step, lost, old, new, **extra):
    return {"event": "recovered", "rank": rank, "time": T0 + time, "detected_time": T0 + detected, "step": step,
            "lost_world_ranks": lost, "old_size": old, "new_size": new, "policy": "shrink", "agree_s": 0.0,
            "recover_s": 0.02, "rebuild_s": 0.03, "bytes_moved": 1000, **extra}


def kill_run():
    """4 ranks, steps of 0.1 s (0.01 s of it replication) at size 4; world rank 2 logs its kill at
    +0.52 s, in step 6; the survivors recover by +0.66 s and commit step 6 at +0.78 s, then steps
    of 0.12 s at size 3 up to step 10 at +1.26 s."""
    ev = [{"event": "start", "rank": r, "time": T0, "step": 0, "world_size": 4, "total_steps": 10,
           "policy": "shrink", "replicas": 1} for r in range(4)]
    for s in range(1, 6):
        ev += [{"event": "commit", "rank": r, "time": T0 + 0.1 * s, "step": s, "world_size": 4,
                "replicate_s": 0.01} for r in range(4)]
    ev.append({"event": "kill", "rank": 2, "time": T0 + 0.52, "step": 6})
    for r, detected, done in ((0, 0.60, 0.66), (1, 0.61, 0.665), (3, 0.605, 0.662)):
        ev.append(_recovered(r, done, detected, 6, [2], 4, 3, detection_s=detected - 0.5))
    for s in range(6, 11):
        t = 0.78 + 0.12 * (s - 6)
        ev += [{"event": "commit", "rank": r, "time": T0 + t, "step": s, "world_size": 3, "replicate_s": 0.01}
               for r in (0, 1, 3)]
        if s == 6:
            ev += [{"event": "first_commit", "rank": r, "time": T0 + t, "step": 6, "world_size": 3} for r in (0, 1, 3)]
    ev += [{"event": "end", "rank": r, "time": T0 + 1.27, "steps": 10, "failures": 1, "redone_steps": 1,
            "world_size": 3} for r in (0, 1, 3)]
    return ev


def test_summary_of_a_known_run(tmp_path):
    _write(tmp_path, "77.", kill_run())
    s = summarize(load_run(tmp_path))
    assert s.run_id == "77." and s.ranks == [0, 1, 2, 3] and s.reference_rank == 0
    assert (s.initial_size, s.final_size, s.policy, s.replicas, s.steps, s.commits) == (4, 3, "shrink", 1, 10, 10)
    # steady steps leave out the warm-up (steps 1, 2) and the interval with the failure (5 -> 6)
    assert s.step_s == {3: approx(0.12), 4: approx(0.1)} and s.replicate_s == {3: approx(0.01), 4: approx(0.01)}
    (f,) = s.failures
    assert (f.step, f.lost_world_ranks, f.old_size, f.new_size, f.fail_time_from) == (6, [2], 4, 3, "kill event")
    assert f.pre_failure_s == approx(0.02)        # last commit +0.50, kill +0.52
    assert f.detection_s == approx(0.08)          # rank 0 saw it at +0.60
    assert (f.recover_s, f.rebuild_s) == (approx(0.02), approx(0.03))
    assert f.redo_s == approx(0.12)               # recovered +0.66, step 6 committed +0.78
    assert f.mttr_s == approx(0.26)
    assert f.lost_s == approx(0.16)               # +0.50 -> +0.78 less one step at size 3
    assert f.redone_steps == 1 and s.redone_steps == 1 and [p.rank for p in f.survivors] == [0, 1, 3]
    assert s.wall_s == approx(1.26) and s.ideal_s == approx(0.9) and s.replication_s == approx(0.1)
    assert s.lost_s == approx(0.16) and s.other_s == approx(0.10)
    assert s.goodput == approx(0.9 / 1.26)


def relaunch_run(source="memory", resumed_step=5):
    """4 ranks on 2 nodes, steps of 0.1 s; after step 5 (+0.5 s) ranks 2 and 3 log their kill at
    +0.55 s and the whole job dies; the relaunch (ranks 0 and 1) starts at +3.0 s, resumes from
    step ``resumed_step`` (load 0.05 s, logged at +3.10 s) and commits steps of 0.2 s from +3.2 s."""
    ev = [{"event": "start", "rank": r, "time": T0, "step": 0, "world_size": 4, "policy": "shrink"} for r in range(4)]
    for s in range(1, 6):
        ev += [{"event": "commit", "rank": r, "time": T0 + 0.1 * s, "step": s, "world_size": 4} for r in range(4)]
    ev += [{"event": "kill", "rank": r, "time": T0 + 0.55, "step": 6} for r in (2, 3)]
    for r in (0, 1):
        ev.append({"event": "start", "rank": r, "time": T0 + 3.0, "step": resumed_step, "world_size": 2})
        ev.append({"event": "resumed", "rank": r, "time": T0 + 3.1, "step": resumed_step, "from": source,
                   "load_s": 0.05, "world_size": 2})
        for s in range(resumed_step + 1, 11):
            ev.append({"event": "commit", "rank": r, "time": T0 + 3.2 + 0.2 * (s - resumed_step - 1), "step": s,
                       "world_size": 2})
        ev.append({"event": "end", "rank": r, "time": T0 + 4.5, "steps": 10, "world_size": 2})
    return ev


def test_a_relaunch_is_on_the_summary_with_its_phases(tmp_path):
    _write(tmp_path, "job.", relaunch_run())
    s = summarize(load_run(tmp_path))
    assert s.failures == [] and s.reference_rank == 0 and s.steps == 10
    (r,) = s.relaunches
    assert (r.last_step, r.step, r.source, r.old_size, r.new_size) == (5, 5, "memory", 4, 2)
    assert r.death_time_from == "kill event" and r.death_time == approx(T0 + 0.55)
    assert r.relaunch_s == approx(2.45) and r.load_s == approx(0.05) and r.redone_steps == 0
    assert r.mttr_s == approx(2.65)                 # +0.55 -> the first commit at +3.2
    assert r.lost_s == approx(3.2 - 0.5 - 0.2)      # last commit +0.5 -> step 6 at +3.2, less a step at size 2
    assert s.step_s == {2: approx(0.2), 4: approx(0.1)}  # the interval over the relaunch is left out
    assert s.lost_s == approx(r.lost_s)
    assert "step 5 (memory)" in format_summary(s) and "relaunches: 1" in format_summary(s)


def test_a_relaunch_from_disk_redoes_the_steps_since_the_checkpoint(tmp_path):
    _write(tmp_path, "job.", relaunch_run("disk", resumed_step=4))
    (r,) = summarize(load_run(tmp_path)).relaunches
    assert (r.step, r.source, r.redone_steps) == (4, "disk", 1)
    assert r.regained_time == approx(T0 + 3.4)      # step 6 again, after step 5 is redone


def test_kill_logged_before_the_reference_rank_logs_the_last_commit(tmp_path):
    """The victim may log its kill (at the start of its next step) a few milliseconds before a
    slower reference rank logs its commit of the step before: the failure still follows that
    commit (the survivors' recovered events name it), and no time is counted before the kill."""
    events = kill_run()
    for e in events:
        if e["event"] == "commit" and e["rank"] == 0 and e["step"] == 5:
            e["time"] = T0 + 0.525  # after the kill at +0.52
    _write(tmp_path, "", events)
    (f,) = summarize(load_run(tmp_path)).failures
    assert (f.step, f.fail_time_from, f.last_commit_time) == (6, "kill event", approx(T0 + 0.525))
    assert f.pre_failure_s == 0.0 and f.lost_s == approx(0.135)  # +0.525 -> +0.78 less one step at size 3


def test_costs_feed_the_model(tmp_path):
    _write(tmp_path, "", kill_run())
    data = costs(summarize(load_run(tmp_path)))
    mem = data["results"][0]["memory"]
    assert data["results"][0]["steady"] == {"step_s": approx(0.1), "replicate_s": approx(0.01),
                                            "replication_overhead": approx(0.1)}
    assert {k: mem[k] for k in ("failures", "detection_s", "agree_shrink_s", "rebuild_s", "redo_s", "pre_failure_s",
                                "mttr_s", "lost_s")} == {
        "failures": 1, "detection_s": approx(0.08), "agree_shrink_s": approx(0.02), "rebuild_s": approx(0.03),
        "redo_s": approx(0.12), "pre_failure_s": approx(0.02), "mttr_s": approx(0.26), "lost_s": approx(0.16)}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    c = Costs.from_json(path, require_disk=False)
    # the model's stall: pre + detection + agree/shrink + rebuild + (redo - steady step)
    assert c.memory_stall_s() == approx(0.02 + 0.08 + 0.02 + 0.03 + 0.02)
    with pytest.raises(ValueError, match="checkpoint_s"):
        Costs.from_json(path)


def test_disk_fallback_without_kill_events(tmp_path):
    """Ranks 1 and 2 (a shard and its only buddy) die in step 6; no kill event: the failure time
    is the earliest start of the failed phase. The survivors restore the checkpoint of step 4 and
    redo steps 5 and 6."""
    ev = [{"event": "start", "rank": r, "time": T0, "step": 0, "world_size": 4, "policy": "shrink", "replicas": 1}
          for r in range(4)]
    for s in range(1, 6):
        ev += [{"event": "commit", "rank": r, "time": T0 + 0.1 * s, "step": s, "world_size": 4,
                "replicate_s": 0.0} for r in range(4)]
    ev.append({"event": "checkpoint", "rank": 0, "time": T0 + 0.405, "step": 4, "seconds": 0.004})
    ev += [_recovered(0, 0.90, 0.60, 6, [1, 2], 4, 2, detection_s=0.07, disk_restore=4),
           _recovered(3, 0.91, 0.62, 6, [1, 2], 4, 2, detection_s=0.10, disk_restore=4)]
    for s, t in ((5, 1.0), (6, 1.1), (7, 1.2), (8, 1.3)):
        ev += [{"event": "commit", "rank": r, "time": T0 + t, "step": s, "world_size": 2, "replicate_s": 0.0}
               for r in (0, 3)]
    ev += [{"event": "end", "rank": r, "time": T0 + 1.31, "world_size": 2} for r in (0, 3)]
    _write(tmp_path, "", ev)
    s = summarize(load_run(tmp_path))
    (f,) = s.failures
    assert f.fail_time_from == "failed phase start" and f.fail_time == approx(T0 + 0.52)  # min(0.60-0.07, 0.62-0.10)
    assert (f.step, f.disk_restore, f.redone_steps) == (6, 4, 2)
    assert f.first_commit_time == approx(T0 + 1.0) and f.regained_time == approx(T0 + 1.1)
    assert s.step_s[2] == approx(0.1) and f.lost_s == approx(1.1 - 0.5 - 0.1)
    assert s.checkpoint_s == approx(0.004) and s.steps == 8 and s.commits == 9  # step 5 committed twice
    assert costs(s)["results"][0]["disk_fallback"]["failures"] == 1


def test_cli_summary_and_json(tmp_path, capsys):
    _write(tmp_path, "77.", kill_run())
    _write(tmp_path, "12.", kill_run()[:8])  # an older, other run in the same directory
    for p in tmp_path.glob("12.*"):
        os.utime(p, (1, 1))
    assert sorted(find_runs(tmp_path)) == ["12.", "77."]
    assert report_cli.main([str(tmp_path), "--no-plot", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "run 77:" in text and "goodput 0.7143" in text and "260.0" in text  # MTTR in ms
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["goodput"] == approx(0.9 / 1.26)
    assert not (tmp_path / "out" / "timeline.png").exists()
    assert report_cli.main([str(tmp_path), "--run", "12", "--no-plot", "--out", str(tmp_path / "o2")]) == 1
    assert "no steady step" in capsys.readouterr().err  # run 12 stops after its first step


def test_cli_draws_the_timeline(tmp_path):
    pytest.importorskip("matplotlib")  # the bench and demo extras install it
    from matplotlib.image import imread

    _write(tmp_path, "77.", kill_run())
    assert report_cli.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    image = imread(tmp_path / "out" / "timeline.png")
    assert image.shape[0] > 300 and image.shape[1] > 1000


def test_errors(tmp_path, capsys, monkeypatch):
    assert report_cli.main([str(tmp_path / "none"), "--no-plot"]) == 1
    assert "no such log directory" in capsys.readouterr().err
    (tmp_path / "rank0.jsonl").write_text('{"event": "start", "time": 1, "rank": 0}\nnot json\n{"event": "x", "time": 2}\n')
    with pytest.raises(ValueError, match="rank0.jsonl:2: not JSON"):
        read_jsonl(tmp_path / "rank0.jsonl")
    (tmp_path / "rank0.jsonl").write_text('{"event": "commit", "time": 1, "rank": 0}\n{"event": "co')  # torn last line
    assert len(read_jsonl(tmp_path / "rank0.jsonl")) == 1
    assert report_cli.main([str(tmp_path), "--no-plot"]) == 1
    assert "no 'start' event" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert report_cli.main([str(tmp_path)]) == 2
    assert "pip install 'ftcomm[bench]'" in capsys.readouterr().err


def test_a_goodput_above_one_says_why_and_no_replicas_is_said_in_words(tmp_path):
    """The same run, but the steps at size 3 take 0.04 s (faster than the 0.1 s at size 4, as on
    a machine with fewer cores than ranks) and the start logs no k (a DDP loop): the text names
    the faster size beside the goodput instead of leaving a bare number above 1."""
    events = []
    for e in kill_run():
        if e["event"] in ("commit", "first_commit", "end") and e["time"] > T0 + 0.7:
            e = dict(e, time=T0 + 0.78 + 0.04 * (e.get("step", 10) - 6))
        if e["event"] == "start":
            e = {k: v for k, v in e.items() if k != "replicas"}
        events.append(e)
    _write(tmp_path, "78.", events)
    s = summarize(load_run(tmp_path))
    text = format_summary(s)
    assert s.replicas is None and "k=None" not in text and "no replicas logged" in text
    assert s.other_s < 0, s.other_s
    assert "steps ran faster after the world changed: 40.00 ms at world size 3" in text, text
    plain = format_summary(summarize(load_run(_fresh(tmp_path, kill_run()))))
    assert "faster" not in plain and "k=1" in plain


def _fresh(tmp_path, events):
    directory = tmp_path / "plain"
    directory.mkdir()
    _write(directory, "77.", events)
    return directory


def test_timeline_legend_beside_the_panels_joined_dot_and_labelled_zoom(tmp_path):
    """The legend overlaps no panel, a spare's "joined" is a dot on its row (named in the
    legend), and every zoomed panel's x axis says what it counts."""
    pytest.importorskip("matplotlib")
    from ftcomm.goodput import timeline

    events = kill_run() + [{"event": "joined", "rank": 4, "time": T0 + 0.66, "step": 6, "world_size": 3}]
    events += [{"event": "commit", "rank": 4, "time": T0 + 0.78 + 0.12 * (s - 6), "step": s, "world_size": 3}
               for s in range(6, 11)]
    _write(tmp_path, "5.", events)
    run = load_run(tmp_path, "5.")
    fig = timeline.figure(run, summarize(run))
    fig.canvas.draw()
    top, *others = fig.axes
    legend = top.get_legend()
    names = [t.get_text() for t in legend.get_texts()]
    assert "spare joined" in names and "rank died" in names, names
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent()), (names, ax.get_title())
    row_of_4 = summarize(run).ranks.index(4)
    dots = [line for line in top.get_lines() if line.get_marker() == "o" and list(line.get_ydata()) == [row_of_4]]
    assert len(dots) == 1 and list(dots[0].get_xdata()) == [approx(0.66)]
    zooms = [ax for ax in fig.axes if ax.get_title().startswith("step ")]
    assert [ax.get_title()[:8] for ax in zooms] == ["step 6: "]
    assert all(ax.get_xlabel() == "seconds since the start of world rank 0" for ax in zooms)
