"""ftcomm-run: launch an MPI job with fault tolerance switched on.

    ftcomm-run -n 4 python train.py --epochs 3
    ftcomm-run --hostfile hosts -n 16 python train.py
    ftcomm-run --dry-run -n 4 python train.py      # print the mpirun command only

It runs the MPI's own launcher (Open MPI's mpirun by default) with ULFM on (`--with-ft ulfm`),
the MCA settings of mpi_configs/openmpi-ulfm.conf, oversubscription allowed, and
`--allow-run-as-root` only when running as root.

Exit status: 0 when every rank that was still alive at the end finished normally, including a job
that lost ranks and recovered (a summary line on stderr names the lost ranks; pass
`--recovered-exit-code N` to get N instead); otherwise the launcher's non-zero status; 124 when
`--timeout` expired and the job was killed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .command import build_command
from .reports import failed_ranks, read_reports, summarize


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="ftcomm-run",
        description="Launch an MPI job with ULFM fault tolerance on (Open MPI 5 by default).",
        epilog="Everything after the options is the program and its arguments.",
    )
    p.add_argument("-n", "--np", type=int, required=True, help="number of ranks")
    p.add_argument("--spares", type=int, default=0, metavar="S",
                   help="start S more processes as idle spares: recover(policy='spares') promotes one "
                        "into each failed rank's place (default 0)")
    p.add_argument("--hostfile", help="hostfile for a multi-node job (see mpi_configs/hostfile.example)")
    p.add_argument("--mpi", choices=("openmpi", "mpich"), default="openmpi",
                   help="which MPI launches the job (default: openmpi)")
    p.add_argument("--mca", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="extra or overriding Open MPI MCA setting (repeatable)")
    p.add_argument("--no-ft", action="store_true", help="launch without ULFM (failure-free runs only)")
    p.add_argument("--no-oversubscribe", dest="oversubscribe", action="store_false",
                   help="refuse more ranks than cores")
    p.add_argument("--mpirun-args", help="more launcher arguments, as one shell-quoted string")
    p.add_argument("--timeout", type=float, help="kill the whole job after this many seconds (exit 124)")
    p.add_argument("--recovered-exit-code", type=int, default=0,
                   help="exit status for a job that lost ranks and recovered (default 0)")
    p.add_argument("--ranks-per-node", type=int, metavar="K",
                   help="place K ranks on each node of the hostfile (--map-by ppr:K:node)")
    p.add_argument("--fake-nodes", action="store_true",
                   help="testing: run every node of --hostfile on this machine, one PRRTE daemon per "
                        "made-up node name (mpi_configs/fake_node_rsh.sh; ranks see FTCOMM_FAKE_NODE)")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("program", nargs=argparse.REMAINDER, help="program and its arguments")
    args = p.parse_args(argv)
    if args.np < 1:
        p.error("-n must be at least 1")
    if not args.program:
        p.error("no program given")
    if args.spares < 0:
        p.error("--spares must be at least 0")
    if args.fake_nodes and not args.hostfile:
        p.error("--fake-nodes needs --hostfile (one line per made-up node: `n1 slots=2`)")
    if args.fake_nodes and "btl" not in {name for name, _ in args.mca}:
        # The made-up nodes share one machine: the sm transport's segments of two fake nodes
        # collide (a segfault in mca_btl_sm_poll_handle_frag at the first MPI_Comm_dup, seen with
        # 5.0.11), so every rank talks TCP, as it would between real nodes.
        args.mca.append(("btl", "self,tcp"))
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        p.error("--ranks-per-node must be at least 1")
    return args


def _kill_ranks(run_dir: str) -> None:
    """SIGKILLs the ranks that published their pid (ftcomm/core/runtime.py) on this host."""
    for path in Path(run_dir).glob("pid-rank*"):
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # already gone, or not a pid of ours


def _run(cmd: list[str], timeout: float | None, run_dir: str) -> int:
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"ftcomm-run: --timeout {timeout:g} s expired; killing the job", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        _kill_ranks(run_dir)  # ranks may sit in another process group than mpirun
        proc.wait()
        return 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait()


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ftcomm-run-") as run_dir:
        cmd = build_command(args, run_dir)
        if args.dry_run:
            print(shlex.join(cmd))
            return 0
        rc = _run(cmd, args.timeout, run_dir)
        reports = read_reports(run_dir)
        finished, lost = summarize(run_dir, args.np + args.spares, reports)
        crashed = failed_ranks(reports)
    if rc == 0 and crashed:  # e.g. MPI_Finalize overran after the error and the rank exited 0
        print(f"ftcomm-run: job failed: world rank(s) {crashed} ended by an uncaught exception",
              file=sys.stderr)
        return 1
    if rc == 0 and lost and not finished:  # every rank was lost: nothing recovered
        print(f"ftcomm-run: job failed: all {args.np} ranks lost", file=sys.stderr)
        return 1
    if rc == 0 and lost:
        print(f"ftcomm-run: job recovered: {len(finished)} of {args.np + args.spares} processes finished, "
              f"lost world rank(s) {lost}", file=sys.stderr)
        return args.recovered_exit_code
    return rc


if __name__ == "__main__":
    sys.exit(main())
