"""Result fingerprints of a resilient step's gradient buckets, compared in the step's one
agreement: the silent-data-corruption check of the data planes (``FTCOMM_FINGERPRINTS=1`` with
``FTCOMM_DATA_PLANE=gloo`` or ``nccl``).

An allreduce leaves the same result on every rank. A bit flipped in one rank's memory after the
data arrived (a faulty DRAM or HBM cell, a bad core) makes that rank's result differ, and DDP would
apply a different gradient there: the replicas drift apart silently. ftcomm's ring compares a
fingerprint of each allreduce's result in that allreduce's own commit agreement
(``csrc/collectives/step_protocol.cpp``). On a data plane the buckets run uncommitted and the
step's one agreement commits them all (``step_commit.py``), so the fingerprints ride there:

1. at the agreement, each rank sums every bucket's result as integer words, on the tensor's own
   device (one read pass, no copy of the bucket to the host: ``word_sum``), and folds the sums into
   one 64-bit fingerprint (``fingerprint``);
2. 14 bits of it and their complement ride in the agreement's flag (``flag_bits``). The agreement
   ANDs the flags, so the two come back as each other's complement exactly when every rank brought
   the same 14 bits (``fingerprints_equal``): one verdict, the same on every rank;
3. results that differ void the step on every rank, with no shrink (no rank failed); one round of
   small messages names the ranks outside a strict majority (``core/fingerprint.py``), and the step
   is redone from its batch under the same step ids. A rank singled out again within
   ``FENCE_WINDOW_STEPS`` committed steps is faulty, not unlucky: it kills itself (fencing) and its
   peers recover from it at once, in the agreement, as from any failure (a shrink or a spare).
   Results that differ ``MAX_VOIDED_IN_A_ROW`` times in a row raise ``ResultsDifferError`` on every
   rank.

The agreement is ULFM's (``MPIX_Comm_agree``, the ULFM chapter of the MPI 4 draft: a bitwise AND
of every live rank's flag, the same on every rank even when a rank dies during it).

What it does not see: a flip inside the transport before the reduction ends reaches every rank
alike (gloo and NCCL have no transit checksums; ftcomm's ring has, ``FTCOMM_CHECKSUMS``), and a
flip while the transport forwards the reduced data reaches the ranks after it, which may then be
the majority (the step is voided all the same, but the wrong ranks are named).
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import torch

from ... import settings
from ...core import fault
from ...core.events import CorruptionEvent, note_corruption, record_corruption
from ...core.fingerprint import compare
from ...core.liveness import fence_self
from ...errors import InvalidInputError, ResultsDifferError

FENCE_WINDOW_STEPS = 1000  # committed steps within which a second odd-one-out fences a rank
MAX_VOIDED_IN_A_ROW = 3    # steps voided in a row for differing results before they raise
CHECKED = "result fingerprints"

# The agreement's flag: bit 0 "my part completed"; bit 1 "my fingerprints are on"; bit 2 "my
# fingerprints are off" (the AND tells all-on, all-off and a mix apart); bits 3-16 the fingerprint,
# bits 17-30 its complement. A rank that brings no fingerprint brings ones in both, changing neither.
COMPLETED, GUARDED, UNGUARDED = 1, 2, 4
_BITS = 14
_MASK = (1 << _BITS) - 1
_SHIFT = 3
_COMPLEMENT_SHIFT = _SHIFT + _BITS
_WORD = {1: torch.int8, 2: torch.int16, 4: torch.int32}
_U64 = (1 << 64) - 1


def word_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum, modulo 2**64, of ``tensor``'s bytes read as signed integer words, as a 0-dim int64
    tensor on ``tensor``'s device.

    The words are 8 bytes wide (a native int64 sum, about ten times faster on a CPU than widening
    4-byte words); the bytes past the last whole 8-byte word are read as words of the element's
    width. A flipped bit changes one word by 2**k, so the sum by 2**k modulo 2**64 (k < 64): every
    single flip changes it. Any dtype and shape; the value depends only on the bytes. One read pass
    on the device, no copy to the host (a non-contiguous tensor, or one not aligned to 8 bytes, is
    copied on its device first)."""
    flat = tensor.detach().contiguous().reshape(-1)
    size = flat.element_size()
    if (flat.storage_offset() * size) % 8:
        flat = flat.clone()  # a fresh allocation is aligned: 8-byte words can be read
    per_word = max(1, 8 // size)
    body = flat.numel() // per_word * per_word  # the elements read as 8-byte words
    total = _words(flat[:body], 8)
    if body < flat.numel():
        total = total + _words(flat[body:], size)
    return total


def _words(flat: torch.Tensor, width: int) -> torch.Tensor:
    """The wrapping int64 sum of ``flat``'s bytes as signed words of ``width`` bytes (8 at most)."""
    return flat.view(_WORD.get(width, torch.int64)).sum(dtype=torch.int64)


def mix(x: int) -> int:
    """splitmix64's finalizer: every output bit depends on every input bit, so any 14 of them
    serve for the agreement. ``x``, and the result, are in [0, 2**64)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _U64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def fingerprint(sums) -> int:
    """One 64-bit fingerprint in [0, 2**64) of the buckets' ``word_sum`` values (ints), in order."""
    h = len(sums)
    for s in sums:
        h = mix(h ^ (int(s) & _U64))
    return h


def flag_bits(fp: int | None) -> int:
    """The agreement bits of fingerprint ``fp`` (bits 3-30 of the flag); None: ones in both halves."""
    low = _MASK if fp is None else fp & _MASK
    complement = _MASK if fp is None else ~low & _MASK
    return (low << _SHIFT) | (complement << _COMPLEMENT_SHIFT)


def fingerprints_equal(agreed: int) -> bool:
    """Whether every rank brought the same fingerprint bits to the agreement that returned ``agreed``
    (a bit where two ranks differ is cleared in both halves)."""
    low = (agreed >> _SHIFT) & _MASK
    complement = (agreed >> _COMPLEMENT_SHIFT) & _MASK
    return (low | complement) == _MASK


class _Ledger:
    """Process-wide counts behind the fencing and the give-up rule (every group's steps)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.committed = 0         # step agreements committed with fingerprints on
        self.voided_in_a_row = 0   # steps voided for differing results since the last commit
        self.odd_one_out = {}      # world rank -> ``committed`` when its result last differed


LEDGER = _Ledger()


class StepFingerprints:
    """The buckets of one step whose results the step's agreement fingerprints."""

    def __init__(self):
        self._buckets = []  # (step id, tensors), in the program's order (the same on every rank)

    def add(self, step: int, tensors) -> None:
        self._buckets.append((step, list(tensors)))

    def take(self, world_rank: int) -> int:
        """The fingerprint of the recorded buckets' results (they have completed), and forgets them.
        Fault injection (tests): a ``point=result,kind=bitflip`` spec for a bucket's step id flips a
        bit of this rank's result first (host tensors)."""
        buckets, self._buckets = self._buckets, []
        sums = []
        for step, tensors in buckets:
            for t in tensors:
                if t.device.type == "cpu":
                    fault.flip("result", world_rank, step, t)
                sums.append(word_sum(t))
        return fingerprint(_to_host(sums))


def _to_host(sums: list) -> list[int]:
    """The 0-dim sums as ints, one copy (and one wait) per device."""
    out = [0] * len(sums)
    by_device = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    for indices in by_device.values():
        values = torch.stack([sums[i] for i in indices]).cpu().tolist()
        for i, v in zip(indices, values):
            out[i] = v
    return out


def agreement_flag(completed: bool, guarded: bool, fp: int | None) -> int:
    """This rank's flag for the step's agreement (the layout above)."""
    return (COMPLETED if completed else 0) | (GUARDED if guarded else UNGUARDED) | flag_bits(fp if guarded else None)


def check_same_setting(comm, agreed: int, step, timeout) -> None:
    """Raises ``InvalidInputError`` on every rank, naming each rank's FTCOMM_FINGERPRINTS, when the
    agreement ``agreed`` shows that some ranks fingerprint their results and others do not (a
    mixed verdict would commit on some ranks only)."""
    if agreed & (GUARDED | UNGUARDED):
        return  # all on or all off
    mine = np.array([1 if settings.fingerprints() else 0], np.int64)
    every = np.empty(comm.size, np.int64)
    comm.allgather(mine, every, timeout=timeout)
    on = [comm.world_ranks[r] for r in range(comm.size) if every[r]]
    off = [comm.world_ranks[r] for r in range(comm.size) if not every[r]]
    raise InvalidInputError(f"step agreement (step {step}): ranks differ on FTCOMM_FINGERPRINTS (on at world ranks "
                            f"{on}, off at world ranks {off}); it must be the same on every rank. The step "
                            "is not committed")


def committed() -> None:
    """A step agreement committed with fingerprints on (the fencing window counts these)."""
    with LEDGER.lock:
        LEDGER.committed += 1
        LEDGER.voided_in_a_row = 0


class Voided(NamedTuple):
    """What ``results_differ`` found, the same on every rank."""

    fenced: list                       # world ranks fenced now (they killed themselves): recover without them
    error: ResultsDifferError | None   # raise it: the step was voided so ``MAX_VOIDED_IN_A_ROW`` times in a row


def results_differ(comm, name: str, step, fp: int, timeout) -> Voided:
    """After an agreement that found different fingerprints (every rank calls it, and voids the
    step): names the ranks outside a strict majority (every rank without one) in one round of small
    messages and records the event. A rank named again within ``FENCE_WINDOW_STEPS`` is fenced: it
    kills itself (SIGKILL) here, and the others are told to recover without it.

    Raises:
        ProcFailedError, RevokedError, CollectiveTimeoutError: the naming round failed (a rank
            died meanwhile): the caller recovers as from any failure.
    """
    found = compare(comm, int(np.uint64(fp).astype(np.int64)), timeout=timeout)
    majority = found is not None and not found.ambiguous
    ranks = found.suspects if majority else list(comm.world_ranks)
    what = f"{name} step {step} voided: silent data corruption: the ranks' results differ"
    if majority:
        what += f": world rank {ranks[0]} differs" if len(ranks) == 1 else f": world ranks {ranks} differ"
        what += " from the majority; nothing committed"
    else:
        what += f": no majority; world ranks {ranks} differ; nothing committed"
    repeat = _note_odd_ones_out(ranks if majority else [])
    if repeat:
        # One agreement first, so that every rank has finished the naming round before anyone acts
        # on the verdict: the fenced rank's death, or a survivor's revoke as it recovers, would cut
        # the round short for a rank still in it (which would then recover without fencing anyone).
        comm.agree(1, timeout=timeout)
        record_corruption(CorruptionEvent(step, ranks, name, CHECKED, f"fenced world ranks {repeat} (results "
                                          f"differed again within {FENCE_WINDOW_STEPS} steps)"))
        if comm.world_rank in repeat:
            fence_self(comm.world_rank, "its gradient allreduce result differed from the majority's again within "
                       f"{FENCE_WINDOW_STEPS} committed steps")
        return Voided(fenced=repeat, error=None)
    with LEDGER.lock:
        LEDGER.voided_in_a_row += 1
        last = LEDGER.voided_in_a_row >= MAX_VOIDED_IN_A_ROW
        if last:
            LEDGER.voided_in_a_row = 0
    what += (f"; {MAX_VOIDED_IN_A_ROW} steps in a row voided so: raised, not redone" if last
             else ": the step is redone from its batch")
    error = ResultsDifferError(what, ranks=ranks, step=step, failed_ranks=ranks)
    note_corruption(error, name, "raised" if last else "redone")
    return Voided(fenced=[], error=error if last else None)


def _note_odd_ones_out(suspects: list) -> list:
    """Records the suspects; returns those named before within the window."""
    with LEDGER.lock:
        now = LEDGER.committed
        repeat = [r for r in suspects if now - LEDGER.odd_one_out.get(r, -10**12) <= FENCE_WINDOW_STEPS]
        for r in suspects:
            LEDGER.odd_one_out[r] = now
        return repeat
