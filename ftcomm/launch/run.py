"""ftcomm-run: launch an MPI job with fault tolerance switched on.

    ftcomm-run -n 4 python train.py --epochs 3
    ftcomm-run --hostfile hosts -n 16 python train.py
    ftcomm-run --dry-run -n 4 python train.py      # print the mpirun command only

It runs the MPI's own launcher: Open MPI's mpirun with ULFM on (`--with-ft ulfm`), the MCA
settings of mpi_configs/openmpi-ulfm.conf, oversubscription allowed, and `--allow-run-as-root`
only when running as root; or MPICH's mpiexec (hydra) with mpi_configs/mpich.env. Which one:
`--mpi`, by default the MPI whose mpiexec is beside this Python (else on PATH), i.e. the one
ftcomm was installed with. MPICH cannot recover from a rank failure: ftcomm-run says so once,
and when a rank's end ends the job it names the rank.

Exit status: 0 when every rank that was still alive at the end finished normally, including a job
that lost ranks and recovered (a summary line on stderr names the lost ranks; pass
`--recovered-exit-code N` to get N instead); otherwise the launcher's non-zero status; 124 when
`--timeout` expired and the job was killed.
"""
from __future__ import annotations

import argparse
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .command import build_command, detect_mpi, mpich_ft_requested
from .reports import failed_ranks, mpich_failure, pid_files, read_reports, summarize

MPICH_RECOVERY_OFF = ("ftcomm-run: MPICH: recovery is off (MPICH's ch4 device has no ULFM): the ranks run "
                      "failure-free, the recovery verbs raise UlfmUnavailableError, and a rank that dies "
                      "ends the whole job. Recovery needs Open MPI 5 (see mpi_configs/README.md).")


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
    p.add_argument("--mpi", choices=("auto", "openmpi", "mpich"), default="auto",
                   help="which MPI launches the job (default auto: the one whose mpiexec is beside this "
                        "Python, else on PATH; MPICH runs failure-free only)")
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
    if args.mpi == "auto":
        try:
            args.mpi = detect_mpi()
        except FileNotFoundError as exc:
            p.error(str(exc))
    if args.mpi == "mpich":
        for given, name in ((args.mca, "--mca"), (args.fake_nodes, "--fake-nodes")):
            if given:
                p.error(f"{name} is for Open MPI; this job runs on MPICH (--mpi mpich)")
        if args.spares and (args.no_ft or not mpich_ft_requested()):
            p.error("--spares needs recovery, which is off on MPICH (see mpi_configs/mpich.env)")
    return args


def _kill_ranks(run_dir: str) -> None:
    """SIGKILLs the ranks that published their pid (ftcomm/core/runtime.py) on this host."""
    for path in Path(run_dir).glob("pid-rank*"):
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # already gone, or not a pid of ours


class _Relay(threading.Thread):
    """Copies the launcher's stdout to ours as it comes, keeping its last bytes: MPICH's mpiexec
    reports there which process ended the job (reports.mpich_failure reads it)."""

    KEEP = 16384

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.tail = b""

    def run(self) -> None:
        out = sys.stdout.buffer
        while chunk := os.read(self.stream.fileno(), 65536):
            self.tail = (self.tail + chunk)[-self.KEEP:]
            if out is None:
                continue  # our stdout is gone: keep draining, or the launcher would block
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                out = None

    def text(self) -> str:
        self.join(timeout=5)
        return self.tail.decode(errors="replace")


class _FirstToEnd(threading.Thread):
    """Watches the ranks' processes on this host (the pids they publish in the run directory, one
    pidfd each) and records which world rank's process ended first: without ULFM that end is what
    ended the job, and mpiexec's own report may name another process, one it killed after.
    ``first`` is (world rank, pid), or None when it cannot tell: nothing ended while watched, or
    two ended together (within one wake-up of this thread)."""

    def __init__(self, run_dir: str, world_size: int):
        super().__init__(daemon=True)
        self.run_dir, self.world_size = run_dir, world_size
        self.first: tuple[int, int] | None = None
        self.done = threading.Event()
        self._any_ended = False

    def run(self) -> None:
        poller, watched, fds = select.poll(), {}, {}
        try:
            while not self.done.is_set():
                ended = []
                if len(watched) < self.world_size:  # ranks publish their pid once MPI is up
                    for rank, pid in pid_files(self.run_dir).items():
                        if rank in watched:
                            continue
                        watched[rank] = pid
                        try:
                            fd = os.pidfd_open(pid)
                        except OSError:  # already gone
                            ended.append((rank, pid))
                            continue
                        fds[fd] = (rank, pid)
                        poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(20):
                    ended.append(fds[fd])
                    poller.unregister(fd)
                if ended and not self._any_ended:
                    self._any_ended = True
                    self.first = ended[0] if len(ended) == 1 else None
        finally:
            for fd in fds:
                os.close(fd)

    def result(self) -> tuple[int, int] | None:
        self.done.set()
        self.join(timeout=5)
        return self.first


def _run(cmd: list[str], timeout: float | None, run_dir: str, relay: bool = False,
         watch: int = 0) -> tuple[int, str, tuple[int, int] | None]:
    """Runs the launcher; returns its exit status (124 after --timeout), the end of its stdout
    when ``relay`` (else ""), and, when ``watch`` (the world size), which world rank's process
    ended first on this host (_FirstToEnd; else None)."""
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE if relay else None)
    relayed = _Relay(proc.stdout) if relay else None
    if relayed:
        relayed.start()
    watcher = _FirstToEnd(run_dir, watch) if watch and hasattr(os, "pidfd_open") else None
    if watcher:
        watcher.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"ftcomm-run: --timeout {timeout:g} s expired; killing the job", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        _kill_ranks(run_dir)  # ranks may sit in another process group than mpirun
        proc.wait()
        rc = 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait()
    return rc, relayed.text() if relayed else "", watcher.result() if watcher else None


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ftcomm-run-") as run_dir:
        cmd = build_command(args, run_dir)
        mpich_without_ft = args.mpi == "mpich" and (args.no_ft or not mpich_ft_requested())
        if args.dry_run:
            print(shlex.join(cmd))
            return 0
        if mpich_without_ft:
            print(MPICH_RECOVERY_OFF, file=sys.stderr, flush=True)
        mpich = args.mpi == "mpich"
        rc, output, first_ended = _run(cmd, args.timeout, run_dir, relay=mpich,
                                       watch=args.np + args.spares if mpich else 0)
        reports = read_reports(run_dir)
        finished, lost = summarize(run_dir, args.np + args.spares, reports)
        crashed = failed_ranks(reports)
        ended_by = None
        if mpich and rc not in (0, 124):  # name what ended the job: mpiexec's own report may not
            ended_by = (f"world rank(s) {crashed} ended by an uncaught exception" if crashed
                        else mpich_failure(first_ended, output))
    if ended_by and mpich_without_ft:
        print(f"ftcomm-run: {ended_by}; MPICH cannot recover from a rank failure (no ULFM), so the whole "
              "job was ended. Recovery needs Open MPI 5 (see mpi_configs/README.md).", file=sys.stderr)
    elif ended_by:
        print(f"ftcomm-run: {ended_by}", file=sys.stderr)
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
