"""``ProcessGroupFtcomm``: a ``torch.distributed.ProcessGroup`` whose collectives are ftcomm's.

torch accepts a Python subclass of ``dist.ProcessGroup`` as a whole process group (what the
registered factory returns; see ``__init__.py``). Each collective is checked on the calling thread
(an unsupported op or device raises ``NotImplementedError`` at once), then queued on ftcomm's
communication thread, and returns an ``FtWork`` whose future holds the output tensors.

Mapping (N = world size of the group, S = bytes per rank):

==========================================  ==============================================  ==============================
torch                                       ftcomm                                          traffic per rank
==========================================  ==============================================  ==============================
allreduce / allreduce_coalesced             ``Communicator.allreduce`` (one committed step)  2(N-1)/N x size
broadcast                                   ``Communicator.broadcast`` + ``agree``           binomial tree
allgather, all_gather_into_tensor           ``Communicator.allgather`` (ring) + ``agree``    (N-1) x S
reduce_scatter, reduce_scatter_tensor       allreduce of a copy of the input, then slice      2(N-1) x S (2x a true one)
barrier                                     ``Communicator.barrier`` + ``agree``             --
==========================================  ==============================================  ==============================

Ops: sum, avg, min, max, product. Failure handling (see ``recovery.py``): every survivor sees a
failure at the same collective (allreduce's commit protocol; the other collectives end with a
ULFM agreement on their outcome), rebuilds the communicator over the survivors, and then either
redoes the collective on the survivors (inside ``ftcomm.torch.resilient``) or fails its Work with
the ftcomm error (outside it; the group is already rebuilt, so the caller may retry).
"""
from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from .. import config
from ..errors import FtError, ProcFailedError, RevokedError
from . import staging
from .executor import EXECUTOR
from .recovery import RecoveryEvent, note_recovery
from .work import FtWork, make_future

BACKEND_NAME = "ftcomm"

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: "sum", _R.AVG: "avg", _R.MIN: "min", _R.MAX: "max", _R.PRODUCT: "prod"}

SUPPORTED = ("allreduce (SUM, AVG, MIN, MAX, PRODUCT), allreduce_coalesced, broadcast, allgather, "
             "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, barrier")


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"ftcomm backend does not implement {name}; it supports {SUPPORTED}")

    method.__name__ = name
    method.__doc__ = f"Not implemented: raises NotImplementedError naming {name!r}."
    return method


def _reduce_op(opts, collective: str) -> str:
    op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
    for red, name in _OPS.items():
        if op == red:
            return name
    label = getattr(op, "op", op)
    raise NotImplementedError(
        f"ftcomm backend: {collective} with op {getattr(label, 'name', label)} is not supported "
        "(supported: SUM, AVG, MIN, MAX, PRODUCT)")


def _byte_view(t: torch.Tensor):
    """A uint8 numpy view of a contiguous CPU tensor's memory (any dtype; shares memory)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class _ShapeChanged(ProcFailedError):
    """A collective whose shapes depend on the world size cannot be redone after a shrink."""


class ProcessGroupFtcomm(dist.ProcessGroup):
    """A torch process group over an ``ftcomm.Communicator``.

    Args:
        comm: the ftcomm communicator (its ranks are the group's ranks).
        timeout: deadline of each collective, seconds (default FTCOMM_TIMEOUT, 60 s).

    Tensors: contiguous CPU tensors; allreduce and reduce_scatter take float32, float64, float16,
    bfloat16, int32, int64 (others fail on every rank with ``ftcomm.InvalidInputError``);
    broadcast and allgather move bytes, so any dtype. ``rank()`` / ``size()`` follow the
    communicator, so they change after a recovery.

    Attributes:
        comm: the current ``ftcomm.Communicator`` (replaced on recovery).
        generation: number of recoveries so far.
    """

    def __init__(self, comm, timeout: float | None = None):
        super().__init__(comm.rank, comm.size)
        self._comm = comm
        self._timeout = config.default_timeout() if timeout is None else float(timeout)
        self.generation = 0
        self._lock = threading.Lock()

    # -- identity ---------------------------------------------------------------------------
    @property
    def comm(self):
        return self._comm

    @property
    def timeout(self) -> float:
        """Deadline of each collective, seconds."""
        return self._timeout

    def getRank(self) -> int:  # noqa: N802 (C++ virtual name)
        return self._comm.rank

    def getSize(self) -> int:  # noqa: N802
        return self._comm.size

    def getBackendName(self) -> str:  # noqa: N802
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"<ProcessGroupFtcomm rank {self._comm.rank} of {self._comm.size}, generation {self.generation}>"

    # -- machinery --------------------------------------------------------------------------
    def _submit(self, name: str, result: list, fn, uniform: bool) -> FtWork:
        fut = make_future(staging.future_devices(result))
        work = FtWork(fut, name)

        def run():
            try:
                self._run(name, fn, uniform)
            except BaseException as exc:  # noqa: BLE001 - reported through the future
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        EXECUTOR.submit(run)
        return work

    def _run(self, name: str, fn, uniform: bool) -> None:
        while True:
            comm = self._comm
            try:
                self._attempt(comm, name, fn, uniform)
                return
            except (ProcFailedError, RevokedError) as exc:
                if isinstance(exc, _ShapeChanged) or not comm.ft_enabled:
                    raise
                if not self._recover(comm, name, exc):
                    raise

    def _attempt(self, comm, name: str, fn, uniform: bool) -> None:
        if uniform or not comm.ft_enabled:
            fn(comm)
            return
        # Collectives built on point-to-point have a local outcome: agree on it, so that every
        # survivor either succeeds or fails (and recovers) at this same collective.
        ok, err = 1, None
        try:
            fn(comm)
        except (ProcFailedError, RevokedError) as exc:
            ok, err = 0, exc
        if comm.agree(ok, timeout=self._timeout) != 1:
            if err is None:
                err = ProcFailedError(f"{name}: a peer failed during the collective")
            raise err

    def _recover(self, comm, name: str, exc: FtError) -> bool:
        t0 = time.perf_counter()
        new = comm.recover(timeout=self._timeout, policy="shrink")  # spares: see create_process_group
        with self._lock:
            self._comm = new
            self.generation += 1
        _sync_torch_rank_table(self)
        lost = [w for w, n in zip(comm.world_ranks, new.old_to_new) if n < 0]
        event = RecoveryEvent(lost_world_ranks=lost, old_size=comm.size, new_size=new.size,
                              collective=name, step=exc.step, recover_s=time.perf_counter() - t0)
        return note_recovery(event)

    # -- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None) -> FtWork:
        """In-place allreduce of ``tensors`` (one tensor per device; several are reduced as one
        bucket, committed as one ftcomm step). ``opts.reduceOp``: SUM, AVG, MIN, MAX, PRODUCT.

        Raises:
            NotImplementedError: another op (BAND, BOR, BXOR, PREMUL_SUM) or a non-CPU tensor.
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
        staging.check_devices(tensors, name)
        host, finish = staging.stage(tensors)

        def fn(comm):
            comm.allreduce(host, op=op, timeout=self._timeout)
            finish()

        return self._submit(name, tensors, fn, uniform=True)

    def broadcast(self, tensors, opts=None) -> FtWork:
        """Broadcast of each tensor from ``opts.rootRank``, in place, any dtype. If the root dies
        inside a resilient step, the survivors take new rank 0's tensors (the step is redone)."""
        tensors = list(tensors)
        staging.check_devices(tensors, "broadcast")
        root = 0 if opts is None else int(opts.rootRank)
        comm0 = self._comm
        if not 0 <= root < comm0.size:
            raise ValueError(f"broadcast: root {root} is outside 0..{comm0.size - 1}")
        root_world = comm0.world_ranks[root]

        def fn(comm):
            ranks = comm.world_ranks
            r = ranks.index(root_world) if root_world in ranks else 0
            for t in tensors:
                if t.numel() == 0:
                    continue
                buf = t if t.is_contiguous() else t.contiguous()
                comm.broadcast(_byte_view(buf), root=r, timeout=self._timeout)
                if buf is not t:
                    t.copy_(buf)

        return self._submit("broadcast", tensors, fn, uniform=False)

    def allgather(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``output_tensors[i][j]`` receives rank j's ``input_tensors[i]`` (any dtype; each output
        the input's size). Ring allgather through one staging buffer per input."""
        outs = [list(o) for o in output_tensors]
        ins = list(input_tensors)
        staging.check_devices(ins + [t for o in outs for t in o], "allgather")
        if len(outs) != len(ins):
            raise ValueError("allgather: need one output list per input tensor")
        if any(len(o) != self._comm.size for o in outs):
            raise ValueError(f"allgather: each output list must hold {self._comm.size} tensors")

        def fn(comm):
            n = comm.size
            for inp, out in zip(ins, outs):
                if len(out) != n:
                    raise _ShapeChanged(f"allgather: {len(out)} outputs for a group of {n} "
                                        "(the group shrank; this collective cannot be redone)")
                src = inp.contiguous()
                flat = torch.empty((n,) + tuple(src.shape), dtype=src.dtype)
                if src.numel():
                    comm.allgather(_byte_view(src), _byte_view(flat), timeout=self._timeout)
                for j, o in enumerate(out):
                    o.copy_(flat[j].view_as(o))

        return self._submit("allgather", outs, fn, uniform=False)

    def all_gather_single(self, output, input, opts=None) -> FtWork:  # noqa: A002
        """``output`` (size x input's elements, contiguous) receives every rank's ``input`` in
        rank order (``dist.all_gather_into_tensor``). No staging copy when ``output`` is
        contiguous."""
        staging.check_devices([output, input], "all_gather_into_tensor")
        if output.numel() != self._comm.size * input.numel():
            raise ValueError(f"all_gather_into_tensor: output must hold {self._comm.size} x "
                             f"{input.numel()} elements, it holds {output.numel()}")

        def fn(comm):
            n = comm.size
            if output.numel() != n * input.numel():
                raise _ShapeChanged(f"all_gather_into_tensor: output holds {output.numel()} elements, "
                                    f"not {n} x {input.numel()}")
            if input.numel() == 0:
                return
            src = input.contiguous()
            dst = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            comm.allgather(_byte_view(src), _byte_view(dst), timeout=self._timeout)
            if dst is not output:
                output.copy_(dst)

        return self._submit("all_gather_into_tensor", [output], fn, uniform=False)

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None) -> FtWork:
        """``output_tensors[i]`` receives the reduction over ranks of ``input_tensors[i][rank]``.
        Done as an allreduce of a copy of the concatenated inputs, then a slice: twice the traffic
        of a true reduce-scatter, plus one copy (inputs are not modified)."""
        op = _reduce_op(opts, "reduce_scatter")
        outs = list(output_tensors)
        ins = [list(x) for x in input_tensors]
        staging.check_devices(outs + [t for x in ins for t in x], "reduce_scatter")
        if len(outs) != len(ins):
            raise ValueError("reduce_scatter: need one input list per output tensor")
        if any(len(x) != self._comm.size for x in ins):
            raise ValueError(f"reduce_scatter: each input list must hold {self._comm.size} tensors")

        def fn(comm):
            n, r = comm.size, comm.rank
            for out, parts in zip(outs, ins):
                if len(parts) != n:
                    raise _ShapeChanged(f"reduce_scatter: {len(parts)} inputs for a group of {n}")
            temps = [torch.cat([p.reshape(-1) for p in parts]) for parts in ins]
            comm.allreduce(temps, op=op, timeout=self._timeout)
            for out, parts, tmp in zip(outs, ins, temps):
                offset = sum(p.numel() for p in parts[:r])
                out.copy_(tmp[offset:offset + parts[r].numel()].view_as(out))

        return self._submit("reduce_scatter", outs, fn, uniform=True)

    def reduce_scatter_single(self, output, input, opts=None) -> FtWork:  # noqa: A002
        """``output`` receives block ``rank`` (``output.numel()`` elements) of the reduction over
        ranks of ``input`` (size x that many elements; ``dist.reduce_scatter_tensor``). Same cost
        as ``reduce_scatter``."""
        op = _reduce_op(opts, "reduce_scatter_tensor")
        staging.check_devices([output, input], "reduce_scatter_tensor")
        if input.numel() != self._comm.size * output.numel():
            raise ValueError(f"reduce_scatter_tensor: input must hold {self._comm.size} x "
                             f"{output.numel()} elements, it holds {input.numel()}")

        def fn(comm):
            n, r, k = comm.size, comm.rank, output.numel()
            if input.numel() != n * k:
                raise _ShapeChanged(f"reduce_scatter_tensor: input holds {input.numel()} elements, "
                                    f"not {n} x {k}")
            tmp = input.reshape(-1).clone()
            comm.allreduce(tmp, op=op, timeout=self._timeout)
            output.copy_(tmp[r * k:(r + 1) * k].view_as(output))

        return self._submit("reduce_scatter_tensor", [output], fn, uniform=True)

    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts=None) -> FtWork:
        """Returns a Work that completes when every rank of the group has called barrier."""

        def fn(comm):
            comm.barrier(timeout=self._timeout)

        return self._submit("barrier", [], fn, uniform=False)

    # -- not implemented --------------------------------------------------------------------
    reduce = _unsupported("reduce")
    gather = _unsupported("gather")
    scatter = _unsupported("scatter")
    alltoall = _unsupported("alltoall")
    alltoall_base = _unsupported("alltoall_base (all_to_all_single)")
    all_to_all_single = _unsupported("all_to_all_single")
    send = _unsupported("send")
    recv = _unsupported("recv")
    recv_anysource = _unsupported("recv_anysource")
    allgather_coalesced = _unsupported("allgather_coalesced")
    allgather_into_tensor_coalesced = _unsupported("allgather_into_tensor_coalesced")
    all_gather_single_coalesced = _unsupported("all_gather_into_tensor_coalesced")
    reduce_scatter_tensor_coalesced = _unsupported("reduce_scatter_tensor_coalesced")
    reduce_scatter_single_coalesced = _unsupported("reduce_scatter_tensor_coalesced")
    monitored_barrier = _unsupported("monitored_barrier")


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
