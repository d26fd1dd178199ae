"""The smallest ftcomm recovery: 4 ranks sum gradients step after step; at step 5 rank 2 is
SIGKILLed in the middle of the ring; the survivors agree on the failure, shrink, redo step 5
over the 3 of them, and go on.

    ftcomm-run -n 4 python examples/shrink_demo.py
"""
import time

from cli import Parser  # examples/cli.py


def parse_args():
    p = Parser(description="ftcomm shrink-and-continue demo")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kill", type=int, default=2, help="world rank to kill (-1: nobody)")
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--elements", type=int, default=1 << 20, help="float32 elements per allreduce")
    return p.parse_args()


# Parsed before torch and MPI load, so that a typo fails at once and is said once (cli.py).
ARGS = parse_args() if __name__ == "__main__" else None

import numpy as np  # noqa: E402

import ftcomm  # noqa: E402


def main():
    args = ARGS

    if args.kill >= 0:
        # Dies after receiving the first chunk of the allgather, mid-collective.
        ftcomm.fault.inject("allgather", rank=args.kill, step=args.kill_step, ring_step=0, chunk=0)
    comm = ftcomm.Communicator()
    me = comm.world_rank
    for step in range(args.steps):
        grad = np.full(args.elements, me + 1.0, np.float32)
        while True:
            try:
                t0 = time.perf_counter()
                comm.allreduce(grad, op="sum", step=step)
                break
            except ftcomm.ProcFailedError as exc:
                detected = time.perf_counter() - t0
                comm = comm.recover()
                if comm.rank == 0:
                    print(f"step {exc.step}: rank(s) {exc.failed_ranks} failed; detected and "
                          f"shrunk in {detected * 1e3:.1f} ms; {comm.size} ranks go on", flush=True)
        expected = sum(w + 1.0 for w in comm.world_ranks)
        assert np.all(grad == expected), f"step {step}: got {grad[0]}, expected {expected}"
        if comm.rank == 0:
            print(f"step {step} committed on {comm.size} ranks: sum = {grad[0]:g} (correct)", flush=True)


if __name__ == "__main__":
    main()
