"""The gloo data plane's rebuild after a recovery: a new group in the kept store (what ftcomm
does while rank 0 stays), a new group in a new store (what it does when rank 0 was lost) and
torch's own reconfigure of the group it has (torch >= 2.14), in the same job, interleaved.

    ftcomm-run -n 4 python benchmarks/inner_group_rebuild.py
    ftcomm-run -n 3 python benchmarks/inner_group_rebuild.py --rounds 40

World rank N-1 stands for the rank a failure took: it sits out, and the other N-1 ranks (the
survivors, a communicator split off the world's) rebuild the data plane over themselves in each
round, then run one allreduce on it (a rebuild is done when the first collective is). Three ways,
in a fresh random order each round, the same on every rank:

- ``kept store``: ``GlooPlane``'s rebuild while rank 0 stays (``ftcomm/torch/group/group_store.py``):
  a new ``ProcessGroupGloo`` in the store the survivors already hold, under a new key prefix
  (one broadcast over the communicator, no new connection);
- ``new store``: its rebuild when rank 0 was lost: a new TCPStore on a free port served by the
  survivors' rank 0, its address broadcast, two new client connections per rank, a new group;
- ``reconfigure``: one ``ProcessGroupGloo(..., enable_reconfigure=True)`` made over all N ranks at
  the start; each round the survivors' reconfigure handles are gathered over the communicator and
  ``ProcessGroup.reconfigure`` is called with them and a new uuid (``torch.distributed._reconfigure``,
  experimental). Skipped where the installed torch lacks it.

A round's time is the slowest survivor's (seconds, ``time.perf_counter``); every round's allreduce
result is checked against its exact sum. Reported: the median, the fastest and the slowest round
per way, and each way's median over the kept store's. Writes results/inner_group_rebuild_n{N}.json.

What the figures do not show: gloo's reconfigure meets its peers through the store the group was
first made over (its handle names that store's address), served by one of the ranks. When that
rank is the one lost, reconfigure has nothing to meet at (torch 2.15: "Broken pipe" on every
survivor), and a new store is needed all the same. A spare, never in the first group, has no
group to reconfigure.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import ftcomm
from ftcomm.torch.group.group_store import GroupStores

_HANDLE_BYTES = 512  # a gloo handle is "gloo:<rank>:...:<host>:<port>", a few dozen bytes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="gloo data plane rebuild: kept store, new store, torch's reconfigure.")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per way (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds per way first (default 2)")
    p.add_argument("--elements", type=int, default=1024, help="float32 elements of the first allreduce (default 1024)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for each rendezvous (default 60)")
    p.add_argument("--out", help="JSON output path (default results/inner_group_rebuild_n{N}.json)")
    return p.parse_args(argv)


def supports_reconfigure() -> bool:
    """Whether the installed torch's gloo group has the reconfigure API (torch 2.14 and newer; not 2.13)."""
    return hasattr(dist.ProcessGroupGloo, "reconfigure") and hasattr(torch._C._distributed_c10d, "ReconfigureOptions")


def _property_or_call(value):
    """torch (2.14, 2.15) binds ``supports_reconfigure`` as a property and
    ``get_reconfigure_handle`` as a method: either is taken."""
    return value() if callable(value) else value


class KeptStore:
    """ftcomm's rebuild while rank 0 stays: a new group in the store the survivors hold."""

    name = "kept store"

    def __init__(self, survivors, timeout: float):
        self.survivors, self.timeout, self.stores = survivors, timeout, GroupStores()

    def rebuild(self, round_id: int):
        store, watch_store = self.stores.for_group(self.survivors, self.timeout, self.timeout)
        group = dist.ProcessGroupGloo(store, self.survivors.rank, self.survivors.size,
                                      datetime.timedelta(seconds=self.timeout))
        return group, (store, watch_store)


class NewStore(KeptStore):
    """ftcomm's rebuild after rank 0 was lost: a new store (server and clients), a new group."""

    name = "new store"

    def rebuild(self, round_id: int):
        self.stores = GroupStores()
        return super().rebuild(round_id)


class Reconfigure:
    """torch's rebuild: the group made over all N ranks at the start, reconfigured over the
    survivors with their handles (gathered over the communicator) and a new uuid."""

    name = "reconfigure"

    def __init__(self, world, survivors, timeout: float):
        self.survivors, self.timeout = survivors, timeout
        # Every world rank takes part in the first making; the lost one then sits out.
        self.store, _ = GroupStores().for_group(world, timeout, timeout)
        self.group = dist.ProcessGroupGloo(self.store, world.rank, world.size,
                                           datetime.timedelta(seconds=timeout), enable_reconfigure=True)
        if not _property_or_call(self.group.supports_reconfigure):
            raise RuntimeError("this gloo group says it does not support reconfigure")
        self._reconfigure(world, uuid=1)  # the group's first membership

    def rebuild(self, round_id: int):
        if self.survivors is not None:
            self._reconfigure(self.survivors, uuid=2 + round_id)
        return self.group, None

    def _reconfigure(self, comm, uuid: int) -> None:
        own = _property_or_call(self.group.get_reconfigure_handle).encode()
        if len(own) > _HANDLE_BYTES:
            raise RuntimeError(f"world rank {comm.world_rank}: a reconfigure handle of {len(own)} bytes "
                               f"(room for {_HANDLE_BYTES})")
        sendbuf = np.zeros(_HANDLE_BYTES, np.uint8)
        sendbuf[:len(own)] = np.frombuffer(own, np.uint8)
        recvbuf = np.zeros(comm.size * _HANDLE_BYTES, np.uint8)
        comm.allgather(sendbuf, recvbuf, timeout=self.timeout)
        handles = [bytes(row).rstrip(b"\0").decode() for row in recvbuf.reshape(comm.size, _HANDLE_BYTES)]
        opts = torch._C._distributed_c10d.ReconfigureOptions()
        opts.uuid, opts.handles = uuid, handles
        opts.timeout = datetime.timedelta(seconds=self.timeout)
        self.group.reconfigure(opts).wait()


def timed_round(way, survivors, round_id: int, elements: int) -> float:
    """One rebuild and its first allreduce on the survivors; the slowest survivor's seconds."""
    survivors.barrier()
    start = time.perf_counter()
    group, store = way.rebuild(round_id)
    x = torch.full((elements,), float(survivors.rank + 1))
    group.allreduce([x]).wait()
    elapsed = time.perf_counter() - start
    want = survivors.size * (survivors.size + 1) / 2
    if not torch.all(x == want):
        raise RuntimeError(f"world rank {survivors.world_rank}: {way.name} round {round_id}: allreduce gave "
                           f"{x[:4].tolist()}..., want {want}")
    del group, store
    return survivors.mpi_comm.allreduce(elapsed, op=MPI.MAX)


def main(argv=None) -> None:
    args = parse_args(argv)
    world = ftcomm.Communicator()
    if world.size < 3:
        raise SystemExit(f"world rank {world.world_rank}: needs 3 or more ranks (N-1 survivors of 2 or more), "
                         f"got {world.size}")
    lost = world.rank == world.size - 1
    survivors = world.split(1 if lost else 0, world.rank)
    ways = [] if lost else [KeptStore(survivors, args.timeout), NewStore(survivors, args.timeout)]
    if supports_reconfigure():
        reconfigure = Reconfigure(world, None if lost else survivors, args.timeout)
        if not lost:
            ways.append(reconfigure)
    times = {w.name: [] for w in ways}
    if not lost:
        order_rng = random.Random(1234)  # the same order on every survivor
        for round_id in range(args.warmup + args.rounds):
            order = list(ways)
            order_rng.shuffle(order)
            for way in order:
                seconds = timed_round(way, survivors, round_id, args.elements)
                if round_id >= args.warmup:
                    times[way.name].append(seconds)
    world.barrier(timeout=args.timeout)  # the lost rank keeps its end of the reconfigure group open
    if world.rank == 0:
        report(times, world.size, args)


def report(times: dict, size: int, args) -> None:
    result = {"world_size": size, "survivors": size - 1, "torch": torch.__version__, "rounds": args.rounds,
              "elements": args.elements, "reconfigure_supported": "reconfigure" in times, "ways": {}}
    print(f"gloo data plane rebuild over {size - 1} survivors of {size} ranks, torch {torch.__version__}, "
          f"{args.rounds} rounds (seconds, the slowest survivor's)")
    kept = statistics.median(times["kept store"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        result["ways"][name] = {"median_s": median, "min_s": min(seconds), "max_s": max(seconds),
                                "over_kept_store": median / kept, "seconds": seconds}
        print(f"  {name:12s} median {median * 1e3:8.2f} ms   fastest {min(seconds) * 1e3:8.2f} ms   "
              f"slowest {max(seconds) * 1e3:8.2f} ms   median / kept store's {median / kept:5.2f}")
    if "reconfigure" not in times:
        print("  reconfigure: not in this torch")
    out = Path(args.out or Path(__file__).resolve().parent.parent / "results" / f"inner_group_rebuild_n{size}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
