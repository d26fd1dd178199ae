"""The data planes' result fingerprints (ftcomm/torch/group/step_fingerprints.py): the word sum
sees every single flipped bit, the agreement's bits tell equal from different fingerprints, and
the step commit commits, voids (naming the odd rank out), fences or raises on the verdict."""
import numpy as np
import pytest
import torch

from ftcomm.core.events import corruptions
from ftcomm.errors import InvalidInputError, ResultsDifferError
from ftcomm.torch.group import step_fingerprints as fp
from ftcomm.torch.group import step_state
from ftcomm.torch.group.step_commit import StepCommit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8,
                                   torch.complex128])
def test_every_single_bit_flip_changes_the_word_sum(dtype):
    torch.manual_seed(0)
    values = (torch.randn(8, dtype=torch.float64) * 100).to(dtype)
    # 7 elements: 8-byte words and a tail of narrower ones; and a view not aligned to 8 bytes
    for t in (values[:7].clone(), values[1:]):
        clean = int(fp.word_sum(t))
        assert clean == int(fp.word_sum(t.clone()))  # the bytes alone decide
        for byte in range(t.numel() * t.element_size()):
            for bit in range(8):
                flipped = t.clone() if t.storage_offset() == 0 else values.clone()[1:]
                flipped.view(torch.uint8)[byte] ^= 1 << bit
                assert int(fp.word_sum(flipped)) != clean, (t.storage_offset(), byte, bit)


def test_the_agreement_bits_are_equal_exactly_when_every_rank_brought_the_same_fingerprint():
    rng = np.random.default_rng(1)
    for _ in range(500):
        a, b = (int(x) for x in rng.integers(0, 2**63, size=2))
        same = fp.agreement_flag(True, True, a)
        assert 0 < same < 2**31
        assert fp.fingerprints_equal(same & same & fp.agreement_flag(True, True, a))
        # a rank without a result brings ones: it changes no verdict
        assert fp.fingerprints_equal(same & fp.agreement_flag(False, True, None))
        mixed = same & fp.agreement_flag(True, True, b)
        assert fp.fingerprints_equal(mixed) == ((a ^ b) & (2**14 - 1) == 0)
    assert fp.fingerprint([1, 2]) != fp.fingerprint([2, 1]) != fp.fingerprint([3])


class _Comm:
    """Rank 0 of a communicator whose peers all bring this rank's flag, but world rank ``odd``
    (if any) a fingerprint that differs in its lowest bit."""

    def __init__(self, size=3, odd=None):
        self.world_rank, self.rank, self.size = 0, 0, size
        self.world_ranks = list(range(size))
        self.odd, self.committed, self.voided = odd, 0, 0
        self.recovered = []  # the failures the group recovered from

    def agree(self, flag, timeout=None):
        other = flag ^ (1 << 3) ^ (1 << 17)  # the lowest fingerprint bit and its complement
        return flag & (other if self.odd is not None else flag)

    def allgather(self, mine, every, timeout=None):
        every[:] = mine[0]
        if self.odd is not None:
            every[self.odd] = mine[0] ^ 1

    def commit_uncommitted(self):
        self.committed += 1

    def void_uncommitted(self):
        self.voided += 1


@pytest.fixture
def fingerprints_on(monkeypatch):
    monkeypatch.setenv("FTCOMM_FINGERPRINTS", "1")
    monkeypatch.setattr(fp, "LEDGER", fp._Ledger())
    yield
    with step_state.STATE.lock:
        step_state.STATE.pending_commits.clear()
        step_state.STATE.poisoned = step_state.STATE.skipped = False


def _step(comm, step_id):
    """One step of one bucket, settled; whether it was voided."""
    group = type("G", (), {"timeout": 5.0, "comm": comm,
                           "_recover": lambda self, c, name, failure: comm.recovered.append(failure) or True})()
    commit = StepCommit(group)
    commit.run(comm, "allreduce", lambda c: step_id, [torch.arange(6, dtype=torch.float32)])
    commit.settle()
    with step_state.STATE.lock:
        voided, step_state.STATE.poisoned = step_state.STATE.poisoned, False
    return voided


def test_equal_results_commit_and_a_rank_whose_result_differs_voids_the_step_then_is_fenced(fingerprints_on):
    comm = _Comm()
    assert not _step(comm, 1) and comm.committed == 1
    before = len(corruptions())
    comm.odd = 2
    assert _step(comm, 2) and comm.committed == 1  # voided: nothing committed, no shrink
    event = corruptions()[-1]
    assert (event.step, event.ranks, event.checked, event.action) == (2, [2], "result fingerprints", "redone")
    comm.odd = None
    assert not _step(comm, 3) and comm.committed == 2
    assert comm.voided == 1 and comm.recovered == []  # the redo keeps the step ids; no shrink
    comm.odd = 2  # the same rank again within the window: fenced (it kills itself; this rank
    assert _step(comm, 4)  # recovers without it at once)
    assert corruptions()[-1].action.startswith("fenced world ranks [2]") and len(corruptions()) == before + 2
    (failure,) = comm.recovered
    assert failure.failed_ranks == [2] and failure.step == 4 and "fenced" in str(failure)


def test_results_that_differ_without_a_majority_raise_on_the_third_step_in_a_row(fingerprints_on):
    comm = _Comm(size=2, odd=1)
    assert _step(comm, 1) and _step(comm, 2)
    with pytest.raises(ResultsDifferError) as raised:
        _step(comm, 3)
    assert raised.value.ranks == [0, 1] and raised.value.step == 3
    assert "no majority" in str(raised.value) and "raised, not redone" in str(raised.value)
    assert [e.action for e in corruptions()[-3:]] == ["redone", "redone", "raised"] and comm.committed == 0


def test_ranks_that_differ_on_the_setting_get_an_error_naming_them(fingerprints_on):
    class Mixed(_Comm):
        def agree(self, flag, timeout=None):
            return flag & ~(fp.GUARDED | fp.UNGUARDED)  # some ranks on, others off

        def allgather(self, mine, every, timeout=None):
            every[:] = [mine[0], 0, mine[0]]

    with pytest.raises(InvalidInputError, match=r"on at world ranks \[0, 2\], off at world ranks \[1\]"):
        _step(Mixed(), 1)
