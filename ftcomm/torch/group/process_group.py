"""``ProcessGroupFtcomm``: a ``torch.distributed.ProcessGroup`` whose collectives are ftcomm's.

torch accepts a Python subclass of ``dist.ProcessGroup`` as a whole process group (what the
registered factory returns; see ``__init__.py``). Each collective is checked on the calling thread
(an unsupported op or device raises ``NotImplementedError`` at once), then queued on ftcomm's
communication thread, and returns an ``FtWork`` whose future holds the output tensors. CUDA
tensors are staged through host memory, in their streams' order, and written only when the
collective succeeded (``device.py``).

Mapping (N = world size of the group, S = bytes per rank):

==========================================  ==============================================  ==============================
torch                                       ftcomm                                          traffic per rank
==========================================  ==============================================  ==============================
allreduce / allreduce_coalesced             ``Communicator.allreduce`` (one committed step)  2(N-1)/N x size
broadcast                                   ``Communicator.broadcast`` + ``agree``           binomial tree
allgather, all_gather_into_tensor           ``Communicator.allgather`` (ring) + ``agree``    (N-1) x S
reduce_scatter, reduce_scatter_tensor       ``Communicator.reduce_scatter`` (committed step)  (N-1)/N x size of the input
reduce                                      ``Communicator.allreduce`` (a copy off the root)  2(N-1)/N x size
gather                                      ``Communicator.allgather`` (ring) + ``agree``    (N-1) x S
scatter                                     ``Communicator.broadcast`` + ``agree``           binomial tree of N x S
all_to_all_single, all_to_all               ``Communicator.exchange`` + ``agree``            what it sends and receives
barrier                                     ``Communicator.barrier`` + ``agree``             --
==========================================  ==============================================  ==============================

The rooted collectives are in ``rooted.py``, all-to-all in ``alltoall.py``.

Ops: sum, avg, min, max, product. Failure handling (see ``loader.py``): every survivor sees a
failure at the same collective (allreduce's commit protocol; the other collectives end with a
ULFM agreement on their outcome), rebuilds the communicator over the survivors, and then either
redoes the collective on the survivors (inside ``ftcomm.torch.resilient``) or fails its Work with
the ftcomm error (outside it; the group is already rebuilt, so the caller may retry).
"""
from __future__ import annotations

import threading
import time
import warnings

import torch
import torch.distributed as dist

from ... import settings
from ...core.events import between
from ...core.outcome import agreed, redone_on_corruption, retrying
from ...errors import FtError, ProcFailedError, RevokedError
from ...membership import spares
from . import alltoall, data_plane, p2p, rooted, sparse
from . import monitored_barrier as monitored
from .device import Staging
from .executor import EXECUTOR
from .host_bytes import byte_view
from .step_commit import StepCommit
from .step_state import in_resilient_step, join_ready, note_recovery
from .work import FtWork, completed_work, joined_work, make_future

BACKEND_NAME = "ftcomm"

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: "sum", _R.AVG: "avg", _R.MIN: "min", _R.MAX: "max", _R.PRODUCT: "prod"}

SUPPORTED = ("allreduce (SUM, AVG, MIN, MAX, PRODUCT), allreduce_coalesced, broadcast, allgather, "
             "all_gather_into_tensor, all_gather_coalesced, all_gather_into_tensor_coalesced, reduce_scatter, "
             "reduce_scatter_tensor, reduce_scatter_tensor_coalesced, reduce, gather, scatter, all_to_all, "
             "all_to_all_single, barrier, monitored_barrier, send, recv (any source too); sparse COO tensors in "
             "allreduce (SUM, CPU)")


def _reduce_op(opts, collective: str) -> str:
    op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
    for red, name in _OPS.items():
        if op == red:
            return name
    label = getattr(op, "op", op)
    raise NotImplementedError(
        f"ftcomm backend: {collective} with op {getattr(label, 'name', label)} is not supported "
        "(supported: SUM, AVG, MIN, MAX, PRODUCT)")


SUPPORTED_DEVICES = ("cpu", "cuda")


def _check_devices(tensors, collective: str) -> None:
    """Raises NotImplementedError for a tensor on a device the backend cannot reduce, or a sparse
    (any but strided) one (only allreduce takes sparse COO tensors)."""
    for t in tensors:
        if t.layout != torch.strided:
            raise NotImplementedError(f"ftcomm backend: {collective} of sparse tensors ({t.layout}) is not supported; "
                                      "pass a dense tensor (tensor.to_dense())")
        if t.device.type not in SUPPORTED_DEVICES:
            raise NotImplementedError(
                f"ftcomm backend: {collective} on {t.device.type} tensors is not supported yet "
                f"(supported devices: {', '.join(SUPPORTED_DEVICES)})")


def _reduce_scatter_into(comm, whole: torch.Tensor, out: torch.Tensor, op: str, timeout) -> None:
    """One committed reduce-scatter of the flat host tensor ``whole`` into the host tensor
    ``out`` (through a contiguous temporary when ``out`` is not contiguous)."""
    flat = whole if whole.is_contiguous() else whole.contiguous()
    if out.is_contiguous():
        comm.reduce_scatter(flat, out.view(-1), op=op, timeout=timeout)
        return
    tmp = torch.empty(out.numel(), dtype=out.dtype)
    comm.reduce_scatter(flat, tmp, op=op, timeout=timeout)
    out.copy_(tmp.view_as(out))


class _ShapeChanged(ProcFailedError):
    """A collective whose shapes depend on the world size cannot be redone after a shrink. Raised
    alike on every rank before any communication, so it needs no agreement."""


# Failures raised alike on every survivor before any communication: no agreement, no recovery.
_NOT_REDONE = (_ShapeChanged, rooted.RootLost)


class ProcessGroupFtcomm(dist.ProcessGroup):
    """A torch process group over an ``ftcomm.Communicator``.

    Args:
        comm: the ftcomm communicator (its ranks are the group's ranks).
        timeout: deadline of each collective, seconds (default FTCOMM_TIMEOUT, 600 s).

    Tensors: CPU or CUDA tensors (CUDA ones staged through host memory, ``device.py``);
    allreduce and reduce_scatter take float32, float64, float16,
    bfloat16, int32, int64 (others fail on every rank with ``ftcomm.InvalidInputError``);
    broadcast and allgather move bytes, so any dtype. A tensor of the wrong size on any rank (an
    output that is not size x the input, an empty tensor where the peers' hold elements) is an
    ``ftcomm.InvalidInputError`` (a ValueError) on every rank, from the collective's input check;
    a wrong number of tensors in a list is a ValueError on that rank only. ``rank()`` /
    ``size()`` follow the communicator, so they change after a recovery.

    With spare ranks (``ftcomm-run --spares S``; docs/TORCH.md "Spares") a failure inside a
    resilient step promotes a spare into each failed rank's place: the survivors finish the voided
    step on a communicator of their own (``_interim``) and hand their state to the newcomer at the
    end of the step (``join.py``); a newcomer's group completes the collectives of
    DDP's constructor locally (``joining``) until that hand-over.

    Attributes:
        comm: the current ``ftcomm.Communicator`` (replaced on recovery; the survivors' own one
            while a voided step finishes before a newcomer joins).
        generation: number of recoveries so far.
        policy: how a failure inside a resilient step is recovered: "shrink" or "spares".
        joining: True on a promoted spare until it has received the survivors' state.
        awaiting_join: True on a survivor while newcomers wait for that state.
    """

    def __init__(self, comm, timeout: float | None = None, policy: str = "shrink", joining: bool = False):
        super().__init__(comm.rank, comm.size)
        self._comm = comm
        self._interim = None  # the survivors' communicator for the rest of a voided step
        self._timeout = settings.default_timeout() if timeout is None else float(timeout)
        self.generation = 0
        self.policy = policy
        self.joining = joining
        self.awaiting_join = False
        self._in_handshake = False
        self._lock = threading.Lock()
        self._step_commit = StepCommit(self)
        self._plane = data_plane.for_setting()  # what moves a resilient step's uncommitted buckets

    # -- identity ---------------------------------------------------------------------------
    @property
    def comm(self):
        return self._interim or self._comm

    @property
    def timeout(self) -> float:
        """Deadline of each collective, seconds."""
        return self._timeout

    @property
    def data_plane(self):
        """What moves a resilient step's uncommitted buckets and ZeRO's parameter allgather
        (``data_plane.py``: the ring, or an inner gloo or NCCL group under FTCOMM_DATA_PLANE)."""
        return self._plane

    def bucket_fault_point(self, tensors) -> str:
        """The ``ftcomm.fault`` point inside a resilient step's gradient allreduce of ``tensors``
        (fault injection, as the examples' ``--kill``): the data plane's when the bucket goes
        through it, else the committed ring's reduce-scatter."""
        if settings.buckets_on_data_plane(self._plane.name) and self._plane.takes(tensors):
            return self._plane.fault_point(tensors)
        return "reduce_scatter"

    def getRank(self) -> int:  # noqa: N802 (C++ virtual name)
        return self.comm.rank

    def getSize(self) -> int:  # noqa: N802
        return self.comm.size

    def getBackendName(self) -> str:  # noqa: N802
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"<ProcessGroupFtcomm rank {self.rank()} of {self.size()}, generation {self.generation}>"

    def _get_backend(self, device):
        """torch's per-device backend of this group. ftcomm registers none with torch's C++
        group (this group is its own backend, for CPU and CUDA tensors alike); torch 2.15 asks
        for one in ``batch_isend_irecv`` (to see whether it coalesces), where this group is the
        answer: it does not coalesce point-to-point."""
        try:
            return super()._get_backend(device)
        except RuntimeError:
            return self

    # torch names a group through its registered backends, and this group is its own backend (a
    # Python process group registers none): the name and description are kept here instead, so
    # that ``group_name`` and ``dist.destroy_process_group(group)`` work.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        """The name torch gave the group (``"0"`` for the default group, then one per subgroup).

        Raises:
            RuntimeError: torch has not named it yet (the factory is still making it).
        """
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        """torch's description of the group ("default_pg", "undefined", or new_group's ``group_desc``)."""
        return getattr(self, "_group_desc", "undefined")

    # -- machinery --------------------------------------------------------------------------
    def _submit(self, name: str, result: list, fn, uniform: bool, local=None, staging: Staging | None = None) -> FtWork:
        """Queues ``fn(comm)`` on the communication thread. ``staging``: the collective's tensors
        (``fn`` works on ``staging.host(t)``); device tensors are copied in after their streams'
        pending work, and back only if the collective succeeded."""
        if self.joining:
            return self._complete_locally(name, result, local)
        staging = staging or Staging()
        fut = make_future(staging.devices)
        work = FtWork(fut, name)

        def run():
            try:
                staging.stage_in()
                self._run(name, fn, uniform)
                staging.copy_back()
            except BaseException as exc:  # noqa: BLE001 - reported through the future
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        EXECUTOR.submit(run)
        return work

    def _complete_locally(self, name: str, result: list, local) -> FtWork:
        """A newcomer before its hand-over: the survivors are not in this collective (DDP's
        constructor issues an allgather and broadcasts that they ran long ago). broadcast and
        barrier complete as no-ops, allgather returns this rank's input for every rank; the
        state they would have synchronised arrives with the hand-over."""
        if local is None:
            raise RuntimeError(
                f"ftcomm backend: {name} on a promoted spare before it joined the survivors: between "
                "init_process_group and the first batch of ftcomm.torch.resilient(...).epochs(), a "
                "newcomer can only run the collectives of DDP's constructor (broadcast, allgather, "
                "barrier). See docs/TORCH.md, Spares.")
        local()
        return completed_work(result, name)

    def _run(self, name: str, fn, uniform: bool) -> None:
        """Runs the collective; after a failure, recovers and runs it again on the new
        communicator (inside a resilient step), or raises (outside one)."""

        def recover_or_raise(error) -> None:
            comm = self.comm
            if isinstance(error, _NOT_REDONE) or not comm.ft_enabled or not self._recover(comm, name, error):
                raise error

        for attempt in retrying(None, on_failure=recover_or_raise):
            with attempt:
                redone_on_corruption(lambda: self._attempt(self.comm, name, fn, uniform), name)

    def _attempt(self, comm, name: str, fn, uniform: bool) -> None:
        if uniform or not comm.ft_enabled:
            fn(comm)
            return
        # Collectives built on point-to-point have a local outcome: agree on it, so that every
        # survivor either succeeds or fails (and recovers) at this same collective. A rank whose own
        # part timed out raises that at once, without the agreement: a live rank late past the
        # deadline is named in a CollectiveTimeoutError, as torch's backends do (under the
        # late-rank policy "fence" it has been fenced and the peers see a failure instead).
        with agreed(comm, name, timeout=self._timeout, catch=(ProcFailedError, RevokedError), keep=_NOT_REDONE):
            fn(comm)

    def _recover(self, comm, name: str, exc: FtError) -> bool:
        """Rebuilds the communicator after ``comm`` failed. Returns True when the failed
        collective is to be redone (inside a resilient step), False when it raises."""
        t0, seen = time.perf_counter(), time.time()
        if comm is self._interim:  # a second failure while a voided step finishes: survivors only
            new = comm.recover(timeout=self._timeout, policy="shrink")
            with self._lock:
                self._interim = new
                self.generation += 1
        else:
            new, interim = self._recover_group(comm)
            with self._lock:
                self._comm, self._interim = new, interim
                self.generation += 1
        _sync_torch_rank_table(self)
        done = new.recovery
        event = between(comm, new, where=name, step=exc.step, error=type(exc).__name__, detected_time=seen,
                        recover_s=time.perf_counter() - t0, policy=done.policy if done else "shrink",
                        fallback=done.fallback if done else None, promoted=list(done.promoted) if done else [])
        if self._in_handshake:  # join.py starts its hand-over again; no step is voided
            note_recovery(event, redo=False)
            return False
        return note_recovery(event)

    def _recover_group(self, comm):
        """(the group's new communicator, the survivors' communicator for the rest of the voided
        step or None). Spares are used only where a newcomer can be handed the state: inside a
        resilient loop set up for it (model, optimizer, epochs) or in the hand-over itself."""
        pool = spares.pool()
        use_spares = (self.policy == "spares" and pool is not None and pool.idle_spares
                      and (self._in_handshake or join_ready()))
        if not use_spares:
            return comm.recover(timeout=self._timeout, policy="shrink"), None
        if self._in_handshake:
            new = comm.recover(timeout=self._timeout, policy="spares")
            self.awaiting_join = self.awaiting_join or bool(new.recovery.promoted)
            return new, None
        # The voided step's remaining collectives (DDP's other buckets, the user's own) must not
        # wait for a newcomer that is still starting: the survivors run them among themselves.
        survivors = comm.shrink_to_survivors(self._timeout)
        new = comm.recover(timeout=self._timeout, policy="spares")
        if not new.recovery.promoted:
            return new, None  # no spare came after all (logged): a plain shrink
        self.awaiting_join = True
        return new, survivors

    def begin_handshake(self):
        """``join.py``: the survivors leave their own communicator and every member of the group
        communicates for real again. Returns the group's communicator."""
        with self._lock:
            self._interim = None
            self._in_handshake = True
            self.joining = False
        return self._comm

    def end_handshake(self) -> None:
        with self._lock:
            self._in_handshake = False
            self.awaiting_join = False
        _sync_torch_rank_table(self)  # back to the full size after the survivors' own communicator

    def recover_in_handshake(self, comm, exc: FtError) -> None:
        """``join.py``: a failure during the hand-over; rebuild (spares first) unless a collective of
        this group already did."""
        if self._comm is comm:
            self._recover(comm, "join", exc)

    def recover_after(self, comm, where: str, exc: FtError) -> bool:
        """A failure in collectives that ran on this group's communicator ``comm`` outside the
        group (``ZeroRedundancyOptimizer.step``'s): rebuilds the group's communicator as a failed
        collective of its own would. Returns True when a resilient step is running (the step is
        then voided and redone), False otherwise."""
        if self.comm is not comm:  # the group already moved on
            return in_resilient_step()
        return self._recover(comm, where, exc)

    # -- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None) -> FtWork:
        """In-place allreduce of ``tensors`` (one tensor per device; several are reduced as one
        bucket, committed as one ftcomm step). ``opts.reduceOp``: SUM, AVG, MIN, MAX, PRODUCT.

        A sparse COO tensor (CPU, SUM only) is summed as gloo does it, by gathering every rank's
        nonzeros (``sparse.py``).

        Raises:
            NotImplementedError: another op (BAND, BOR, BXOR, PREMUL_SUM), a tensor on a device
                other than CPU and CUDA, or a sparse tensor with another op, on CUDA, or in a list.
        Work errors: ``ftcomm.InvalidInputError`` (dtype, contiguity, lengths differ between
            ranks), ``ftcomm.ProcFailedError`` outside a resilient step, timeouts.
        """
        return self._allreduce_bucket("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None) -> FtWork:
        """Allreduce of several tensors as one bucket (one committed step)."""
        return self._allreduce_bucket("allreduce_coalesced", tensors, opts)

    def _allreduce_bucket(self, name: str, tensors, opts) -> FtWork:
        op = _reduce_op(opts, name)
        tensors = list(tensors)
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self._allreduce_sparse(name, tensors, op)
        _check_devices(tensors, name)
        if StepCommit.applies(self.comm, tensors, self._plane):  # backward's buckets: one agreement per step
            # The plane moves them as they are, uncommitted, device tensors included (in their
            # streams' order); the step's agreement commits them (step_commit.py). Started from
            # this thread where the plane can, else queued.
            started = None if self.joining else self._step_commit.start(self.comm, name, tensors, op, self._plane)
            if started is not None:
                return started

            def uncommitted(comm):
                return self._plane.allreduce(comm, tensors, op, self._timeout)

            return self._submit(name, tensors, lambda comm: self._step_commit.run(comm, name, uncommitted, tensors),
                                uniform=True, staging=Staging(inout=tensors, copy=False))
        staging = Staging(inout=tensors)

        def fn(comm):
            return comm.allreduce([staging.host(t) for t in tensors], op=op, timeout=self._timeout)

        return self._submit(name, tensors, fn, uniform=True, staging=staging)

    def _allreduce_sparse(self, name: str, tensors, op: str) -> FtWork:
        """SUM of one CPU sparse COO tensor, in place (``sparse.py``); not committed as a step.

        Raises:
            NotImplementedError: another op, several tensors, or a CUDA sparse tensor.
        """
        if op != "sum" or len(tensors) != 1 or tensors[0].device.type != "cpu":
            raise NotImplementedError(f"ftcomm backend: {name} of sparse tensors takes one CPU tensor and SUM "
                                      f"(got {len(tensors)} tensor(s) on {tensors[0].device}, op {op})")
        (tensor,) = tensors

        def fn(comm):
            sparse.allreduce_sum(comm, tensor, self._timeout)

        return self._submit(name, tensors, fn, uniform=False)

    def broadcast(self, tensors, opts=None) -> FtWork:
        """Broadcast of each tensor from ``opts.rootRank``, in place, any dtype. If the root dies
        inside a resilient step, the survivors take new rank 0's tensors (the step is redone)."""
        tensors = list(tensors)
        _check_devices(tensors, "broadcast")
        root = 0 if opts is None else int(opts.rootRank)
        comm0 = self.comm
        if not 0 <= root < comm0.size:
            raise ValueError(f"broadcast: root {root} is outside 0..{comm0.size - 1}")
        root_world = comm0.world_ranks[root]
        staging = Staging(inout=tensors)

        def fn(comm):
            ranks = comm.world_ranks
            r = ranks.index(root_world) if root_world in ranks else 0
            # Empty tensors too: a rank that skipped its part would leave the peers waiting in the
            # broadcast's input check, where a length that differs is an error on every rank.
            for t in map(staging.host, tensors):
                buf = t if t.is_contiguous() else t.contiguous()
                comm.broadcast(byte_view(buf), root=r, timeout=self._timeout)
                if buf is not t:
                    t.copy_(buf)

        return self._submit("broadcast", tensors, fn, uniform=False, local=_nothing, staging=staging)

    def allgather(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``output_tensors[i][j]`` receives rank j's ``input_tensors[i]`` (any dtype; each output
        the input's size). Ring allgather through one staging buffer per input."""
        outs = [list(o) for o in output_tensors]
        ins = list(input_tensors)
        _check_devices(ins + [t for o in outs for t in o], "allgather")
        if len(outs) != len(ins):
            raise ValueError("allgather: need one output list per input tensor")
        if any(len(o) != self.comm.size for o in outs):
            raise ValueError(f"allgather: each output list must hold {self.comm.size} tensors")
        staging = Staging(inputs=ins, outputs=[t for o in outs for t in o])

        def fn(comm):
            n = comm.size
            for inp, out in zip(ins, outs):
                if len(out) != n:
                    raise _ShapeChanged(f"allgather: {len(out)} outputs for a group of {n} "
                                        "(the group shrank; this collective cannot be redone)")
                src = staging.host(inp).contiguous()
                # As many elements as the outputs hold: an output of another size than the input
                # makes the allgather's input check fail on every rank (empty tensors included).
                flat = torch.empty(sum(o.numel() for o in out), dtype=src.dtype)
                comm.allgather(byte_view(src), byte_view(flat), timeout=self._timeout)
                flat = flat.view((n,) + tuple(src.shape))
                for j, o in enumerate(out):
                    staging.host(o).copy_(flat[j].view_as(o))

        def local():
            for inp, out in zip(ins, outs):
                for o in out:
                    o.copy_(inp.view_as(o))

        return self._submit("allgather", outs, fn, uniform=False, local=local, staging=staging)

    def all_gather_single(self, output, input, opts=None) -> FtWork:  # noqa: A002
        """``output`` (size x input's elements, contiguous) receives every rank's ``input`` in
        rank order (``dist.all_gather_into_tensor``). No staging copy when ``output`` is
        contiguous."""
        _check_devices([output, input], "all_gather_into_tensor")
        size = self.comm.size
        staging = Staging(inputs=[input], outputs=[output])

        def fn(comm):
            n = comm.size
            if output.numel() == size * input.numel() != n * input.numel():  # fitted before a shrink
                raise _ShapeChanged(f"all_gather_into_tensor: output holds {output.numel()} elements, "
                                    f"not {n} x {input.numel()}")
            # A wrong output size is found by the allgather's input check, on every rank.
            src, out = staging.host(input).contiguous(), staging.host(output)
            dst = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
            comm.allgather(byte_view(src), byte_view(dst), timeout=self._timeout)
            if dst is not out:
                out.copy_(dst)

        def local():
            output.view(-1, max(input.numel(), 1))[:, :input.numel()].copy_(input.reshape(1, -1))

        return self._submit("all_gather_into_tensor", [output], fn, uniform=False, local=local, staging=staging)

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``output_tensors[i]`` receives the reduction over ranks of ``input_tensors[i][rank]``
        (every input the output's size). One committed ring reduce-scatter per output, over the
        concatenated inputs (one copy of them; the inputs are only read)."""
        op = _reduce_op(opts, "reduce_scatter")
        outs = list(output_tensors)
        ins = [list(x) for x in input_tensors]
        _check_devices(outs + [t for x in ins for t in x], "reduce_scatter")
        if len(outs) != len(ins):
            raise ValueError("reduce_scatter: need one input list per output tensor")
        if any(len(x) != self.comm.size for x in ins):
            raise ValueError(f"reduce_scatter: each input list must hold {self.comm.size} tensors")
        # Inputs of another size than their output are found by the reduce-scatter's input check
        # (the concatenated input is not size x the output), on every rank.
        staging = Staging(inputs=[t for x in ins for t in x], outputs=outs)

        def fn(comm):
            for parts in ins:
                if len(parts) != comm.size:
                    raise _ShapeChanged(f"reduce_scatter: {len(parts)} inputs for a group of {comm.size}")
            for out, parts in zip(outs, ins):
                whole = torch.cat([staging.host(p).reshape(-1) for p in parts])
                _reduce_scatter_into(comm, whole, staging.host(out), op, self._timeout)

        return self._submit("reduce_scatter", outs, fn, uniform=True, staging=staging)

    def reduce_scatter_single(self, output, input, opts=None) -> FtWork:  # noqa: A002
        """``output`` receives block ``rank`` (``output.numel()`` elements) of the reduction over
        ranks of ``input`` (size x that many elements; ``dist.reduce_scatter_tensor``). One
        committed ring reduce-scatter, no copy when both are contiguous host tensors; ``output``
        may be a view into ``input``."""
        op = _reduce_op(opts, "reduce_scatter_tensor")
        _check_devices([output, input], "reduce_scatter_tensor")
        size = self.comm.size
        staging = Staging(inputs=[input], outputs=[output])

        def fn(comm):
            # A wrong size is found by the reduce-scatter's input check, on every rank; only a
            # shape that fitted the group before it shrank is this rank's to refuse.
            if input.numel() == size * output.numel() != comm.size * output.numel():
                raise _ShapeChanged(f"reduce_scatter_tensor: input holds {input.numel()} elements, "
                                    f"not {comm.size} x {output.numel()}")
            _reduce_scatter_into(comm, staging.host(input).reshape(-1), staging.host(output), op, self._timeout)

        return self._submit("reduce_scatter_tensor", [output], fn, uniform=True, staging=staging)

    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts=None) -> FtWork:
        """Returns a Work that completes when every rank of the group has called barrier."""

        def fn(comm):
            comm.barrier(timeout=self._timeout)

        return self._submit("barrier", [], fn, uniform=False, local=_nothing)

    def allgather_coalesced(self, output_lists, input_list, opts=None) -> FtWork:
        """``dist.all_gather_coalesced``: ``output_lists[r][j]`` receives rank r's
        ``input_list[j]`` (torch's layout: one list per rank), as ``allgather`` of each input.

        Raises:
            ValueError: not one output list per rank, or a list without one tensor per input.
        """
        output_lists, input_list = [list(out) for out in output_lists], list(input_list)
        if len(output_lists) != self.size() or any(len(out) != len(input_list) for out in output_lists):
            raise ValueError(f"all_gather_coalesced on world rank {self.comm.world_rank}: needs {self.size()} output "
                             f"lists (one per rank) of {len(input_list)} tensors (one per input), got "
                             f"{[len(out) for out in output_lists]}")
        return self.allgather([list(per_input) for per_input in zip(*output_lists)], input_list, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> FtWork:
        """``all_gather_into_tensor`` of each (output, input) pair, in one Work (torch's
        coalescing manager)."""
        return self._each_pair("all_gather_into_tensor_coalesced", self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> FtWork:
        """``reduce_scatter_tensor`` of each (output, input) pair, in one Work."""
        return self._each_pair("reduce_scatter_tensor_coalesced", self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _each_pair(self, name: str, single, outputs, inputs, opts) -> FtWork:
        outputs, inputs = list(outputs), list(inputs)
        if len(outputs) != len(inputs):
            raise ValueError(f"{name}: {len(outputs)} outputs for {len(inputs)} inputs")
        works = [single(o, i, opts) for o, i in zip(outputs, inputs)]  # queued in order
        return joined_work(works, outputs, name)

    def reduce(self, tensors, opts=None) -> FtWork:
        """``dist.reduce``: the root's tensor (``opts.rootRank``) receives the reduction over
        ranks; the others' are left as they were. ``rooted.py``."""
        op = _reduce_op(opts, "reduce")
        (tensor,) = tensors
        _check_devices([tensor], "reduce")
        root_world = self._root_world(opts, "reduce")
        staging = Staging(inout=[tensor])
        return self._submit("reduce", [tensor], lambda comm: rooted.reduce(comm, staging.host(tensor), root_world, op,
                                                                           self._timeout),
                            uniform=True, staging=staging)

    def gather(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``dist.gather``: the root's ``output_tensors[0][j]`` receives rank j's input.
        ``rooted.py``."""
        (tensor,) = input_tensors
        outs = list(output_tensors[0]) if output_tensors else []
        _check_devices([tensor, *outs], "gather")
        root_world = self._root_world(opts, "gather")
        staging = Staging(inputs=[tensor], outputs=outs)
        size = self.comm.size

        def fn(comm):
            if comm.size != size:  # on every rank (only the root holds outputs): none waits alone
                raise _ShapeChanged(f"gather: a group of {size} became {comm.size}: the root's outputs no longer fit")
            rooted.gather(comm, [staging.host(o) for o in outs], staging.host(tensor), root_world, self._timeout)

        return self._submit("gather", output_tensors, fn, uniform=False, staging=staging)

    def scatter(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``dist.scatter``: rank j's ``output_tensors[0]`` receives the root's
        ``input_tensors[0][j]``. ``rooted.py``."""
        (tensor,) = output_tensors
        ins = list(input_tensors[0]) if input_tensors else []
        _check_devices([tensor, *ins], "scatter")
        root_world = self._root_world(opts, "scatter")
        staging = Staging(inputs=ins, outputs=[tensor])
        size = self.comm.size

        def fn(comm):
            if comm.size != size:  # on every rank (only the root holds inputs): none waits alone
                raise _ShapeChanged(f"scatter: a group of {size} became {comm.size}: the root's inputs no longer fit")
            rooted.scatter(comm, staging.host(tensor), [staging.host(t) for t in ins], root_world, self._timeout)

        return self._submit("scatter", [tensor], fn, uniform=False, staging=staging)

    def _root_world(self, opts, name: str) -> int:
        """The world rank of ``opts.rootRank``.

        Raises:
            ValueError: a root outside the group (on this rank; torch checks it first).
        """
        root, comm = (0 if opts is None else int(opts.rootRank)), self.comm
        if not 0 <= root < comm.size:
            raise ValueError(f"{name}: root {root} is outside 0..{comm.size - 1}")
        return comm.world_ranks[root]

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None) -> FtWork:  # noqa: A002
        """``dist.all_to_all_single``: ``output``'s block j (rows of dim 0; even blocks when no
        split sizes are given) receives rank j's block for this rank of ``input``. Split sizes
        that do not pair up are an ``InvalidInputError`` on every rank. ``alltoall.py``."""
        _check_devices([output, input], "all_to_all_single")
        outs, ins = list(output_split_sizes or []), list(input_split_sizes or [])
        staging = Staging(inputs=[input], outputs=[output])
        size = self.comm.size

        def fn(comm):
            if comm.size != size:  # blocks and split sizes were laid out for the old group, on every rank
                raise _ShapeChanged(f"all_to_all_single: blocks for a group of {size}, now {comm.size}")
            alltoall.alltoall_single(comm, staging.host(output), staging.host(input), outs, ins, self._timeout)

        return self._submit("all_to_all_single", [output], fn, uniform=False, staging=staging)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``dist.all_to_all``: ``output_tensors[j]`` receives rank j's ``input_tensors[rank]``.
        ``alltoall.py``."""
        outs, ins = list(output_tensors), list(input_tensors)
        _check_devices(outs + ins, "all_to_all")
        staging = Staging(inputs=ins, outputs=outs)
        size = self.comm.size

        def fn(comm):
            if comm.size != size:
                raise _ShapeChanged(f"all_to_all: {len(outs)} outputs for a group of {size}, now {comm.size}")
            alltoall.alltoall(comm, [staging.host(t) for t in outs], [staging.host(t) for t in ins], self._timeout)

        return self._submit("all_to_all", outs, fn, uniform=False, staging=staging)

    # -- point-to-point ---------------------------------------------------------------------
    def send(self, tensors, dst_rank: int, tag: int = 0) -> FtWork:
        """``dist.send`` / ``isend``: ``tensors[0]`` to group rank ``dst_rank`` under ``tag``
        (0 <= tag < 7000), posted now, completed by its own waiter (``p2p.py``).

        Raises:
            ValueError: a peer that is not another rank of the group, a tag out of range.
        Work errors: ``ProcFailedError`` (the peer died, or was fenced), ``CollectiveTimeoutError``
            (not received within the group's timeout).
        """
        return self._point_to_point("send", tensors, dst_rank, tag, is_send=True)

    def recv(self, tensors, src_rank: int, tag: int = 0) -> FtWork:
        """``dist.recv`` / ``irecv`` from group rank ``src_rank``: the message must be the
        tensor's size (else ``InvalidInputError``). Errors as ``send``."""
        return self._point_to_point("recv", tensors, src_rank, tag, is_send=False)

    def recv_anysource(self, tensors, tag: int = 0) -> FtWork:
        """``dist.recv(src=None)``: from whichever rank sends first under ``tag``; the Work's
        ``_source_rank()`` names it. A failure of any rank of the group while it waits is a
        ``ProcFailedError`` (the dead rank might have been the sender)."""
        return self._point_to_point("recv_anysource", tensors, None, tag, is_send=False)

    def _point_to_point(self, name: str, tensors, peer, tag, is_send: bool) -> FtWork:
        (tensor,) = tensors
        _check_devices([tensor], name)
        comm = self.comm
        if peer is not None:
            p2p.check_peer(peer, comm, name)
        p2p.check_tag(tag, name)
        if self.joining:
            raise RuntimeError(f"ftcomm backend: {name} on a promoted spare before it joined the survivors")
        staging = Staging(inputs=[tensor]) if is_send else Staging(outputs=[tensor])
        return p2p.post(comm, tensor, peer, tag, is_send, self._timeout, staging)

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier on this group (``monitored_barrier.py``): blocks until every
        rank reached it, else rank 0 raises naming the ranks that did not. ``timeout``: a
        ``timedelta`` or seconds (default: the group's timeout).

        Raises:
            CollectiveTimeoutError: a rank did not report, or rank 0 did not answer.
            ProcFailedError: a rank waited for died.
        """
        if self.joining:
            raise RuntimeError("ftcomm backend: monitored_barrier on a promoted spare before it joined the survivors")
        seconds = self._timeout if timeout is None else (
            timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout))
        if not seconds >= 0:
            raise ValueError(f"ftcomm backend: monitored_barrier timeout {timeout!r} on world rank "
                             f"{self.comm.world_rank} is not a duration of 0 or more")
        monitored.monitored_barrier(self.comm, seconds, wait_all_ranks)


def ftcomm_group(process_group, user: str) -> "ProcessGroupFtcomm":
    """``process_group``, or the default group when None; ``user`` (what needs it, for the error)
    takes only ftcomm groups.

    Raises:
        TypeError: the group is not an ftcomm one.
    """
    pg = dist.distributed_c10d._get_default_group() if process_group is None else process_group
    if not isinstance(pg, ProcessGroupFtcomm):
        raise TypeError(f"{user} needs an ftcomm process group, not {type(pg).__name__}: "
                        'call dist.init_process_group("ftcomm") first (or pass process_group=)')
    return pg


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """``dist.monitored_barrier`` for ftcomm groups (torch's own accepts only gloo by name): every
    rank of ``group`` (default: the default group) blocks until all reached it; otherwise rank 0
    raises naming the first rank that did not (every one with ``wait_all_ranks``), and the others
    raise at their deadline. ``timeout``: a ``timedelta`` or seconds (default: the group's).

    Raises:
        TypeError: ``group`` is not an ftcomm group.
        ValueError: a negative timeout.
        CollectiveTimeoutError, ProcFailedError: as ``ProcessGroupFtcomm.monitored_barrier``.
    """
    if dist.distributed_c10d._rank_not_in_group(group):  # as torch's: a rank outside the group returns
        warnings.warn("ftcomm.torch.monitored_barrier: this rank is not in the group; nothing to do", stacklevel=2)
        return
    ftcomm_group(group, "ftcomm.torch.monitored_barrier").monitored_barrier(timeout, wait_all_ranks)


def _nothing() -> None:
    return None


def _sync_torch_rank_table(pg) -> None:
    """After a shrink, make torch's rank table for this group (``dist.get_process_group_ranks``)
    list the new consecutive ranks. Best effort: it is torch's private bookkeeping."""
    try:
        from torch.distributed import distributed_c10d as c10d

        table = c10d._world.pg_group_ranks
        if pg in table and pg is c10d._world.default_pg:
            table[pg] = {i: i for i in range(pg.size())}
    except Exception:  # noqa: BLE001
        pass
