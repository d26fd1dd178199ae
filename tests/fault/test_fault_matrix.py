"""The fault matrix. A representative set of cells of scripts/fault_matrix.py (every
allreduce point and every training point at least once, every kind at least twice, the cascades),
each its own 4-rank job under a hard timeout; the script runs the full matrix. Each cell checks:
the exit status of ftcomm-run (recovered = --recovered-exit-code), the same error on every
survivor, buffers untouched by an aborted step, survivors' state bitwise equal to a reference
(allreduce: accumulated sums from the membership of each committed step; training: the gathered
state of the last committed step), and every committed step applied exactly once.

Plus bad input on every public call (one job) and the exit status of a failed run.
"""
import importlib.util
import json
import sys

import pytest

from harness import JOBS, REPO, run_job

pytestmark = pytest.mark.fault

_spec = importlib.util.spec_from_file_location("fault_matrix", REPO / "scripts" / "fault_matrix.py")
matrix = importlib.util.module_from_spec(_spec)
sys.modules["fault_matrix"] = matrix  # dataclasses look their module up there
_spec.loader.exec_module(matrix)

REPRESENTATIVE = [
    "allreduce-before-hang", "allreduce-reduce_scatter-kill", "allreduce-allgather-stop", "allreduce-commit-exit",
    "train-train_step-stop", "train-shard_update-hang", "train-replicate-exit", "train-shrink-hang",
    "train-rebuild-kill", "ddp-allgather-stop", "ddp-step_commit-kill", "ddp-allgather-kill-loss",
    "cascade-two-at-once", "cascade-hang-and-kill", "cascade-down-to-one", "cascade-buddies-disk",
    "failed-run-exit-status",
]
CELLS = {c.name: c for c in matrix.cells()}


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_matrix_cell(name, tmp_path):
    row = matrix.run_cell(CELLS[name], timeout_s=120, tmp=str(tmp_path))
    assert row.outcome == "ok", "\n".join(row.problems)
    if CELLS[name].expect == "recovered":
        assert row.state_check.startswith("bitwise")
        assert row.steps_redone >= 1
        if any(k in CELLS[name].fault for k in ("kind=hang", "kind=stop")):
            # fenced after FTCOMM_TIMEOUT (5 s here) of silence, not after a survivor's watchdog
            assert row.detection_ms is not None and row.detection_ms < 60_000


def test_representative_set_covers_every_point_and_kind():
    chosen = " ".join(CELLS[n].fault for n in REPRESENTATIVE)
    for point in ("before", "reduce_scatter", "allgather", "commit", "train_step", "shard_update",
                  "replicate", "shrink", "rebuild", "step_commit"):
        assert f"point={point}," in chosen, point
    for kind in matrix.KINDS:
        assert chosen.count(f"kind={kind}") >= 2, kind
    assert len(matrix.cells()) == 50


EXPECTED_BAD = {  # case -> exception type raised on every rank (None: accepted)
    "allreduce_wrong_type": "InvalidInputError", "allreduce_length_differs": "InvalidInputError",
    "allreduce_dtype_differs": "InvalidInputError", "allreduce_size_changes_one_rank": "InvalidInputError",
    "allreduce_step_backwards": "InvalidInputError", "allreduce_step_differs": "InvalidInputError",
    "allreduce_read_only": "InvalidInputError", "allreduce_bad_op": "InvalidInputError",
    "allreduce_nan_inf": None, "allreduce_size_changes_all_ranks": None,
    "allgather_recv_too_small": "InvalidInputError", "allgather_send_differs": "InvalidInputError",
    "allgather_not_a_buffer": "InvalidInputError", "allgather_dtype_differs": "InvalidInputError",
    "allgather_ok": None,
    "broadcast_root_differs": "InvalidInputError", "broadcast_root_out_of_range": "InvalidInputError",
    "broadcast_root_not_int": "InvalidInputError", "broadcast_size_differs": "InvalidInputError",
    "agree_bad_flag": "InvalidInputError", "agree_negative_flag": "InvalidInputError",
    "exchange_bad_peer": "InvalidInputError",
    "sharded_optimizer_float64": "ValueError", "sharded_optimizer_bad_rule": "ValueError",
    "revoked_allreduce": "RevokedError", "revoked_barrier": "RevokedError", "revoked_allgather": "RevokedError",
    "revoked_broadcast": "RevokedError", "revoked_exchange": "RevokedError",
}


def test_bad_input_same_clear_error_on_every_rank_and_nothing_lost():
    res = run_job(JOBS / "matrix_bad_input.py", 4, env={"FTCOMM_TIMEOUT": "20"}, timeout=150)
    assert res.returncode == 0, res.describe()
    cases = {}
    for r in res.reports:
        if r["event"] == "case":
            cases.setdefault(r["case"], {})[r["world_rank"]] = r["error"]
    assert sorted(cases) == sorted(EXPECTED_BAD), res.describe()
    for name, by_rank in cases.items():
        assert sorted(by_rank) == [0, 1, 2, 3], name
        errors = list(by_rank.values())
        assert all(e == errors[0] for e in errors), f"{name}: ranks raised different errors: {json.dumps(by_rank)}"
        expected = EXPECTED_BAD[name]
        assert (errors[0] and errors[0]["type"]) == expected, f"{name}: {errors[0]}"
    # the error names the offending rank and the reason
    assert "rank 1 (world rank 1) rejected its input" in cases["allreduce_wrong_type"][0]["msg"]
    assert "saw: buffer 0 (int) is not an array or tensor" in cases["allreduce_wrong_type"][0]["msg"]
    assert ("different dtypes (rank 0 (world rank 0): float32, rank 3 (world rank 3): float64)"
            in cases["allreduce_dtype_differs"][0]["msg"])
    assert "op 'median' was given" in cases["allreduce_bad_op"][0]["msg"]
    assert "different step ids (rank 1 (world rank 1): 1, rank 0 (world rank 0): 2)" in cases["allreduce_step_differs"][0]["msg"]
    assert ("different lengths (rank 0 (world rank 0): 64 elements, rank 2 (world rank 2): 65)"
            in cases["allreduce_length_differs"][0]["msg"])
    assert "rank 2" in cases["allgather_recv_too_small"][0]["msg"]
    assert "different roots" in cases["broadcast_root_differs"][0]["msg"]
    assert cases["allreduce_step_differs"][0]["step"] == 2
    # NaN and Inf pass through: [nan, inf, -inf, inf] + finite sums
    nan_inf = res.by_rank(event="nan_inf")
    assert all(r["values"] == ["nan", "inf", "-inf", "inf", "8.0", "8.0", "8.0", "8.0"] for r in nan_inf.values())
    assert all(r["ok"] for r in res.by_rank(event="allgather_result").values())
    assert all(r["ok"] for r in res.by_rank(event="broadcast_untouched").values())
    end = res.by_rank(event="end")
    assert sorted(end) == [0, 1, 2, 3]
    for r in end.values():
        # steps 0, 1 (NaN/Inf), 2 (new size) and 3 committed; nothing else moved the ledger
        assert r["committed_untouched"] and r["after_ok"] and r["ledger"] == 3, r
        assert r["fresh_size"] == 4 and r["fresh_sum"] == 10.0, r


def test_clean_run_exits_zero():
    res = run_job(JOBS / "matrix_allreduce.py", 4, "--steps", "3", env={"FTCOMM_TIMEOUT": "20"}, timeout=90,
                  launcher_args=["--recovered-exit-code", "3"])
    assert res.returncode == 0, res.describe()
    assert all(r["errors"] == [] and r["state_ok"] for r in res.by_rank(event="done").values())
