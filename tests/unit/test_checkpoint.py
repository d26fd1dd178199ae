"""The disk tier on one process: the DCP parts every rank writes and their join (read back by
torch's own DCP reader and re-sharded by ours), the directory's atomic completion and pruning, the
interval (fixed, and Young/Daly against ftcomm.goodput's model), staging, and the asynchronous
writer's life cycle with a stand-in communicator whose agreement ANDs the flags of several ranks."""
import math
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ftcomm.goodput import model as goodput
from ftcomm.training.checkpoint import AsyncCheckpointer, Blob, Piece, Whole, directory, interval, sharded
from ftcomm.errors import InvalidInputError, StateLostError
from ftcomm.training.checkpoint import resume
from ftcomm.training.checkpoint.dcp_parts import CheckpointIOError, data_files, join_parts, read, verify, write_part
from ftcomm.training.checkpoint.staging import StagingBuffers


def write_sharded(path, parts: int, full: torch.Tensor, extra=None):
    """Writes ``full`` as ``parts`` ranks' pieces of "optim.exp_avg" (the ZeRO layout), joins."""
    step = -(-full.numel() // parts)
    for r in range(parts):
        lo, hi = min(r * step, full.numel()), min((r + 1) * step, full.numel())
        entries = {"optim.exp_avg": Piece(full[lo:hi].clone(), lo, full.numel())} if hi > lo else {}
        entries.update((extra or {}).get(r, {}))
        write_part(str(path), r, entries)
    join_parts(str(path), parts)


def test_parts_join_into_a_checkpoint_torch_reads(tmp_path):
    full, w = torch.randn(1001), torch.randn(7, 5)
    write_sharded(tmp_path, 3, full, {0: {"model.w": Whole(w), "loader": Blob({"epoch": 2, "used": 64})},
                                      2: {"rng.2": Blob(b"\x01\x02")}})
    assert sorted(os.listdir(tmp_path)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp",
                                            "ftcomm.checksums"]
    state = {"optim": {"exp_avg": torch.zeros(1001)}, "model": {"w": torch.zeros(7, 5)}}
    dcp.load(state, checkpoint_id=str(tmp_path), no_dist=True)  # torch's reader, nested names
    assert torch.equal(state["optim"]["exp_avg"], full) and torch.equal(state["model"]["w"], w)
    dcp_to_torch_save(str(tmp_path), str(tmp_path / "whole.pt"))  # torch's converter, nested alike
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert sorted(whole) == ["loader", "model", "optim", "rng"] and sorted(whole["model"]) == ["w"]
    assert torch.equal(whole["optim"]["exp_avg"], full) and torch.equal(whole["model"]["w"], w)
    assert whole["loader"] == {"epoch": 2, "used": 64} and whole["rng"] == {"2": b"\x01\x02"}


@pytest.mark.parametrize("lo,hi", [(0, 1001), (300, 700), (333, 334), (667, 1001), (5, 5)])
def test_a_slice_across_writers_chunks_reads_bitwise(tmp_path, lo, hi):
    full = torch.randn(1001)
    write_sharded(tmp_path, 3, full)
    out = torch.full((hi - lo,), float("nan"))
    objects = read(str(tmp_path), {"optim.exp_avg": out}, {"optim.exp_avg": (lo, hi)})
    assert objects == {} and torch.equal(out, full[lo:hi])


def test_parts_of_different_runs_are_refused(tmp_path):
    write_part(str(tmp_path), 0, {"optim.exp_avg": Piece(torch.zeros(5), 0, 10)})
    write_part(str(tmp_path), 1, {"optim.exp_avg": Piece(torch.zeros(6), 5, 11)})
    with pytest.raises(ValueError, match="optim.exp_avg"):
        join_parts(str(tmp_path), 2)


def test_only_renamed_checkpoints_count_and_pruning_keeps_the_newest(tmp_path):
    root = str(tmp_path)
    for step in (4, 8, 12):
        tmp = directory.temporary_dir(root, step, "0-ab")
        write_sharded(tmp, 2, torch.arange(10.0) + step)
        if step != 12:
            directory.publish(root, tmp, step)
    half = directory.temporary_dir(root, 16, "0-ab")  # a write that never completed
    write_part(half, 0, {"x": Whole(torch.ones(2))})
    assert directory.complete_steps(root) == [4, 8] and directory.latest(root)[0] == 8
    removed = directory.prune(root, keep=1, older_than=12)
    assert sorted(removed) == ["step00000004", "step00000012.tmp-0-ab"]
    assert sorted(os.listdir(root)) == ["step00000008", "step00000016.tmp-0-ab"]  # 16 may be being written
    again = directory.temporary_dir(root, 8, "1-cd")  # the same step written again after a relaunch
    write_sharded(again, 2, torch.arange(10.0) * 2)
    directory.publish(root, again, 8)
    out = torch.zeros(10)
    read(directory.step_dir(root, 8), {"optim.exp_avg": out})
    assert torch.equal(out, torch.arange(10.0) * 2) and directory.complete_steps(root) == [8]


def test_owners_balance_bytes_the_same_way_on_every_rank():
    sizes = {"a": 400, "b": 300, "c": 300, "d": 100, "e": 100}
    owners = sharded.owners(sizes, 2)
    assert owners == sharded.owners(dict(reversed(sizes.items())), 2)  # order of the dict does not matter
    load = [sum(s for n, s in sizes.items() if owners[n] == r) for r in range(2)]
    assert sorted(load) == [600, 600]
    assert set(sharded.owners(sizes, 8).values()) == {0, 1, 2, 3, 4}


def test_staging_copies_into_buffers_it_keeps():
    staging = StagingBuffers()
    w, piece = torch.randn(4, 4), torch.randn(8)
    first = staging.stage({"w": Whole(w), "p": Piece(piece[2:6], 2, 8), "b": Blob({"lr": [0.1]})})
    w.add_(1.0)
    assert not torch.equal(first["w"].tensor, w) and torch.equal(first["p"].tensor, piece[2:6])
    second = staging.stage({"w": Whole(w), "p": Piece(piece[2:6], 2, 8), "b": Blob({"lr": [0.1]})})
    assert second["w"].tensor.data_ptr() == first["w"].tensor.data_ptr()  # reused, nothing allocated
    assert torch.equal(second["w"].tensor, w) and staging.nbytes == (16 + 4) * 4


def test_fixed_interval_and_bad_settings(monkeypatch):
    s = interval.Schedule(5)
    assert [step for step in range(1, 21) if s.due(step)] == [5, 10, 15, 20]
    for bad in (0, -1, 2.5, "often", True):
        with pytest.raises(ValueError, match="checkpoint_every"):
            interval.Schedule(bad)
    monkeypatch.delenv("FTCOMM_MTBF", raising=False)
    with pytest.raises(ValueError, match="FTCOMM_MTBF"):
        interval.Schedule("auto")
    monkeypatch.setenv("FTCOMM_MTBF", "7200")
    assert interval.Schedule("auto").mtbf_s == 7200.0


def test_auto_interval_is_young_daly_of_the_measured_costs():
    s = interval.Schedule("auto", mtbf_s=3600.0)
    for _ in range(20):
        s.note_step(0.10, writing=False)
        s.note_step(0.12, writing=True)
    s.note_write(stall_s=0.004, write_s=0.5)
    s.costs.startup_s, s.costs.load_s = 20.0, 5.0
    p = s.proposal()
    # C = stall + the steps' slowdown while writing (5 steps of 0.5 s / 0.1 s, 0.02 s each)
    assert p["checkpoint_s"] == pytest.approx(0.004 + 0.02 * 5)
    assert p["interval_s"] == pytest.approx(goodput.young_daly_interval(p["checkpoint_s"], 3600.0, 25.0))
    assert p["steps"] == math.ceil(p["interval_s"] / 0.10)


def test_auto_choice_is_the_smallest_proposal_of_the_agreement():
    ranks = [interval.Schedule("auto", mtbf_s=m) for m in (3600.0, 100.0, 36000.0)]
    for s in ranks:
        s.note_step(0.05, writing=False)
        s.note_write(stall_s=0.01, write_s=0.2)
    agreed = -1
    for s in ranks:
        agreed &= s.proposal_bits()
    chosen = [s.adopt(agreed)["steps"] for s in ranks]
    smallest = min(s.proposal()["steps"] for s in ranks)
    assert len(set(chosen)) == 1 and smallest <= chosen[0] <= smallest * 1.42  # one sqrt(2) bucket


def test_auto_schedule_restarts_the_same_everywhere_after_a_new_group():
    a, b = interval.Schedule("auto", mtbf_s=100.0), interval.Schedule("auto", mtbf_s=100.0)
    a.started(10)
    a.adopt(interval.thermometer(2))  # a survivor that had measured and chosen
    a.restart_from(57)
    b.restart_from(57)  # a promoted spare, fresh
    every = interval.steps_of(interval.FIRST_BUCKET)
    first = (57 // every + 1) * every
    assert [x for x in range(58, 99) if a.due(x)][:1] == [x for x in range(58, 99) if b.due(x)][:1] == [first]


class FakeComm:
    """One rank of a group whose agreement ANDs this rank's flag with ``others`` (the flags the
    other ranks would pass), and whose min/max round sees only this rank."""

    def __init__(self, rank=0, size=1, others=()):
        self.rank, self.size, self.world_rank = rank, size, rank
        self.world_ranks = tuple(range(size))
        self.others = list(others)
        self.agreements = []

    def agree(self, flag, timeout=None):
        for other in self.others:
            flag &= other
        self.agreements.append(flag)
        return flag

    def minmax(self, values, timeout=None):
        return list(values), list(values)


def entries(value: float) -> dict:
    return {"model.w": Whole(torch.full((1000,), value)), "meta": Blob({"value": value})}


def test_writer_writes_completes_publishes_and_prunes(tmp_path):
    ckpt, comm = AsyncCheckpointer(tmp_path, every=2, keep=2), FakeComm()
    for step in range(1, 9):
        ckpt.at_step(comm, step, lambda step=step: entries(float(step)))
        ckpt.wait_written()  # let the write finish before the next boundary
    ckpt.finish(comm)
    ckpt.close()
    assert ckpt.completed == [2, 4, 6, 8] and directory.complete_steps(tmp_path) == [6, 8]
    out = torch.zeros(1000)
    assert read(directory.step_dir(str(tmp_path), 8), {"model.w": out}, objects=("meta",)) == {"meta": {"value": 8.0}}
    assert torch.equal(out, torch.full((1000,), 8.0))
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_a_checkpoint_due_while_one_is_written_is_skipped(tmp_path, monkeypatch):
    release = threading.Event()
    slow = AsyncCheckpointer._write_part

    def held(*args):
        release.wait(30)
        return slow(*args)

    monkeypatch.setattr(AsyncCheckpointer, "_write_part", staticmethod(held))
    events = []
    ckpt, comm = AsyncCheckpointer(tmp_path, every=1, log=lambda **e: events.append(e)), FakeComm()
    for step in (1, 2, 3):
        ckpt.at_step(comm, step, lambda step=step: entries(float(step)))
    release.set()
    ckpt.finish(comm)
    ckpt.close()
    assert ckpt.skipped == [2, 3] and [e["step"] for e in events if e["event"] == "checkpoint_skipped"] == [2, 3]
    # at the end the last step's skipped checkpoint is written after all (its state is unchanged)
    assert ckpt.completed == [1, 3] and directory.complete_steps(tmp_path) == [1, 3]
    out = torch.zeros(1000)
    read(directory.step_dir(str(tmp_path), 3), {"model.w": out})
    assert torch.equal(out, torch.full((1000,), 3.0))


def test_a_rank_that_could_not_write_abandons_the_checkpoint_everywhere(tmp_path):
    events = []
    # the other rank reports its part done but failed (flag _DONE without _OK)
    ckpt = AsyncCheckpointer(tmp_path, every=4, log=lambda **e: events.append(e))
    comm = FakeComm(rank=1, size=2, others=[1 | (-1 << 2) & (2**31 - 1)])
    ckpt.at_step(comm, 4, entries(4.0))
    ckpt.wait_written()
    ckpt.at_step(comm, 5, entries(5.0))
    ckpt.close()
    assert ckpt.completed == [] and [e["event"] for e in events] == ["checkpoint_abandoned"]
    assert directory.complete_steps(tmp_path) == []


def test_a_new_group_abandons_the_write_in_flight(tmp_path):
    events = []
    ckpt, old, new = AsyncCheckpointer(tmp_path, every=4, log=lambda **e: events.append(e)), FakeComm(), FakeComm()
    ckpt.at_step(old, 4, entries(4.0))
    ckpt.at_step(new, 5, entries(5.0))  # a recovery between the two boundaries
    ckpt.finish(new, final=False)
    ckpt.close()
    assert ckpt.completed == [] and events[0]["event"] == "checkpoint_abandoned"
    assert new.agreements == []  # nothing in flight on the new group: no agreement


def test_the_end_checkpoints_the_last_step_once(tmp_path):
    events = []
    ckpt, comm = AsyncCheckpointer(tmp_path, every=4, log=lambda **e: events.append(e)), FakeComm()
    for step in range(1, 7):
        ckpt.at_step(comm, step, lambda step=step: entries(float(step)))
        ckpt.wait_written()
    ckpt.finish(comm)  # step 6 was not due: written now, marked final
    ckpt.finish(comm)  # and not again
    ckpt.close()
    assert ckpt.completed == [4, 6] and directory.complete_steps(tmp_path) == [4, 6]
    assert [(e["step"], e["final"]) for e in events if e["event"] == "checkpoint"] == [(4, False), (6, True)]
    out = torch.zeros(1000)
    read(directory.step_dir(str(tmp_path), 6), {"model.w": out})
    assert torch.equal(out, torch.full((1000,), 6.0))


def test_a_write_error_is_an_os_error_and_the_writer_abandons_that_checkpoint(tmp_path):
    blocked = tmp_path / "blocked"
    (blocked / "__0_0.distcp").mkdir(parents=True)  # DCP cannot create its data file there
    with pytest.raises(CheckpointIOError, match="IsADirectoryError"):
        write_part(str(blocked), 0, entries(1.0))
    events = []
    ckpt, comm = AsyncCheckpointer(tmp_path / "ckpt", every=2, log=lambda **e: events.append(e)), FakeComm()
    ckpt.at_step(comm, 1, entries(1.0))
    token = ckpt._token(comm)
    (Path(directory.temporary_dir(ckpt.root, 2, token)) / "__0_0.distcp").mkdir(parents=True)
    for step in (2, 3, 4):
        ckpt.at_step(comm, step, entries(float(step)))
        ckpt.wait_written()  # let the write end before the next boundary
    ckpt.finish(comm)
    ckpt.close()
    assert [e["step"] for e in events if e["event"] == "checkpoint_abandoned"] == [2] and ckpt.completed == [4]
    assert directory.complete_steps(ckpt.root) == [4]


def test_verify_finds_a_flipped_bit(tmp_path):
    write_sharded(tmp_path, 2, torch.arange(100.0))
    verify(str(tmp_path), data_files(str(tmp_path)))
    with open(tmp_path / "__1_0.distcp", "r+b") as f:
        f.seek(300)
        byte = f.read(1)
        f.seek(300)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointIOError, match="__1_0.distcp: checksum"):
        verify(str(tmp_path), data_files(str(tmp_path)))


def _published(root, step, value, parts=2):
    tmp = directory.temporary_dir(str(root), step, "0-x")
    write_sharded(tmp, parts, torch.full((100,), value))
    directory.publish(str(root), tmp, step)


def _reader(path, step):
    out = torch.zeros(100)
    read(path, {"optim.exp_avg": out})
    return out


def test_resume_skips_a_damaged_checkpoint_for_the_one_before(tmp_path, capsys):
    _published(tmp_path, 4, 4.0)
    _published(tmp_path, 8, 8.0)
    damaged = directory.step_dir(str(tmp_path), 8)
    with open(os.path.join(damaged, "__0_0.distcp"), "r+b") as f:
        f.seek(-20, os.SEEK_END)
        f.write(b"\0" * 8)
    events = []
    step, path, loaded = resume.load_newest(FakeComm(), str(tmp_path), _reader, lambda p, s, x: x,
                                            lambda **e: events.append(e))
    assert step == 4 and torch.equal(loaded, torch.full((100,), 4.0))
    assert [e["step"] for e in events] == [8] and "checkpoint_unusable" == events[0]["event"]
    assert "cannot use checkpoint" in capsys.readouterr().err


def test_resume_raises_when_no_checkpoint_can_be_read_and_on_another_model(tmp_path):
    assert resume.load_newest(FakeComm(), str(tmp_path / "none"), _reader, lambda p, s, x: x) is None
    _published(tmp_path, 4, 4.0)

    def other_model(path, step):
        raise InvalidInputError("another model")

    with pytest.raises(InvalidInputError, match="another model"):
        resume.load_newest(FakeComm(), str(tmp_path), other_model, lambda p, s, x: x)
    # a rank that read it well, while another found another model: the same error, on every rank
    with pytest.raises(InvalidInputError, match="found on another rank"):
        resume.load_newest(FakeComm(others=[1]), str(tmp_path), _reader, lambda p, s, x: x)
    os.unlink(os.path.join(directory.step_dir(str(tmp_path), 4), "__1_0.distcp"))
    with pytest.raises(StateLostError, match="could be read on every rank"):
        resume.load_newest(FakeComm(), str(tmp_path), _reader, lambda p, s, x: x)
