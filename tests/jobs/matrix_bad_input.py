"""Fault-matrix job: bad input on every public call, at 4 ranks. For each case every
rank reports the exception it raised (type and message; None if none), so the test can check that
all ranks raised the same error. At the end: the communicator still works, the ledger moved on
only with committed steps, and a committed buffer was never touched by a rejected call.
"""
import numpy as np
import torch

import ftcomm
from harness import report

comm = ftcomm.Communicator()
r, n = comm.rank, comm.size


def case(name, fn):
    try:
        fn()
        out = None
    except Exception as exc:  # noqa: BLE001 - the test compares the type and message
        out = {"type": type(exc).__name__, "msg": str(exc), "step": getattr(exc, "step", None)}
    report(event="case", case=name, error=out)


committed = np.arange(64, dtype=np.float32) + r
comm.allreduce(committed, step=0)  # commits step 0
kept = committed.copy()
good = lambda: np.ones(64, np.float32)  # noqa: E731

# allreduce
case("allreduce_wrong_type", lambda: comm.allreduce([1, 2, 3] if r == 1 else good(), step=1))
case("allreduce_length_differs", lambda: comm.allreduce(np.ones(65 if r == 2 else 64, np.float32), step=1))
case("allreduce_dtype_differs", lambda: comm.allreduce(np.ones(64, np.float64 if r == 3 else np.float32), step=1))
case("allreduce_size_changes_one_rank", lambda: comm.allreduce(np.ones(128 if r == 1 else 64, np.float32), step=1))
case("allreduce_step_backwards", lambda: comm.allreduce(good(), step=-1))
case("allreduce_step_differs", lambda: comm.allreduce(good(), step=1 + (r == 0)))
case("allreduce_read_only", lambda: comm.allreduce(np.ones(64, np.float32)[::2] if r == 2 else good(), step=1))
case("allreduce_bad_op", lambda: comm.allreduce(good(), op="median", step=1))
special = np.zeros(8, np.float32)
special[r] = [np.nan, np.inf, -np.inf, np.inf][r]
special[4:] = r + 0.5
case("allreduce_nan_inf", lambda: comm.allreduce(special, step=1))  # commits step 1
report(event="nan_inf", values=[repr(float(v)) for v in special])
grown = np.ones(256, np.float32)
case("allreduce_size_changes_all_ranks", lambda: comm.allreduce(grown, step=2))  # legal: commits step 2

# allgather / broadcast / agree / exchange
recv = np.zeros(4 * 16, np.float32)
case("allgather_recv_too_small", lambda: comm.allgather(np.ones(16, np.float32),
                                                        np.zeros(10 if r == 2 else 64, np.float32)))
case("allgather_send_differs", lambda: comm.allgather(np.ones(17 if r == 0 else 16, np.float32),
                                                      np.zeros(68 if r == 0 else 64, np.float32)))
case("allgather_not_a_buffer", lambda: comm.allgather("abc" if r == 3 else np.ones(16, np.float32), recv))
case("allgather_dtype_differs", lambda: comm.allgather(np.ones(16, np.int32 if r == 1 else np.float32),
                                                       np.zeros(64, np.int32 if r == 1 else np.float32)))
case("allgather_ok", lambda: comm.allgather(np.full(16, r, np.float32), recv))
report(event="allgather_result", ok=bool(np.array_equal(recv, np.repeat(np.arange(4), 16).astype(np.float32))))
bbuf = np.full(32, r, np.float32)
case("broadcast_root_differs", lambda: comm.broadcast(bbuf, root=r % 2))
case("broadcast_root_out_of_range", lambda: comm.broadcast(bbuf, root=7))
case("broadcast_root_not_int", lambda: comm.broadcast(bbuf, root="0"))
case("broadcast_size_differs", lambda: comm.broadcast(np.ones(33 if r == 3 else 32, np.float32), root=0))
report(event="broadcast_untouched", ok=bool((bbuf == r).all()))
case("agree_bad_flag", lambda: comm.agree("1"))
case("agree_negative_flag", lambda: comm.agree(-1))
case("exchange_bad_peer", lambda: comm.exchange(sends=[(9, np.ones(4, np.float32))]))

# ShardedOptimizer
case("sharded_optimizer_float64", lambda: ftcomm.ShardedOptimizer([torch.nn.Parameter(torch.ones(3, dtype=torch.float64))], comm))
case("sharded_optimizer_bad_rule", lambda: ftcomm.ShardedOptimizer([torch.nn.Parameter(torch.ones(3))], comm, optimizer="lamb"))

# calls on a revoked communicator
other = ftcomm.Communicator()
if r == 0:
    other.revoke()
while not other.is_revoked:
    try:
        other.barrier(timeout=5)
    except ftcomm.FtError:
        break
case("revoked_allreduce", lambda: other.allreduce(good(), step=0))
case("revoked_barrier", lambda: other.barrier(timeout=5))
case("revoked_allgather", lambda: other.allgather(np.ones(16, np.float32), recv))
case("revoked_broadcast", lambda: other.broadcast(np.ones(4, np.float32), root=0))
case("revoked_exchange", lambda: other.exchange(sends=[((r + 1) % n, np.ones(4, np.float32))],
                                                 recvs=[((r - 1) % n, np.zeros(4, np.float32))]))
fresh = other.recover()  # nobody failed: the same four ranks, usable again
value = np.array([r + 1.0])
fresh.allreduce(value)

# the original communicator is intact, and so is what it committed
after = np.ones(64, np.float32)
comm.allreduce(after, step=3)
report(event="end", committed_untouched=bool(np.array_equal(committed, kept)), ledger=comm.last_committed_step,
       after_ok=bool((after == 4).all()), fresh_size=fresh.size, fresh_sum=float(value[0]))
