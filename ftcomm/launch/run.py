"""ftcomm-run: launch an MPI job with fault tolerance switched on, and with ``--restarts N``
bring it back when it dies.

    ftcomm-run -n 4 python train.py --epochs 3
    ftcomm-run --hostfile hosts -n 16 --restarts 3 python train.py
    ftcomm-run --dry-run -n 4 python train.py      # print the mpirun command only

It runs the MPI's own launcher: Open MPI's mpirun with ULFM on (`--with-ft ulfm`), the MCA
settings of mpi_configs/openmpi-ulfm.conf, oversubscription allowed, and `--allow-run-as-root`
only when running as root; or MPICH's mpiexec (hydra) with mpi_configs/mpich.env. Which one:
`--mpi`, by default the MPI whose mpiexec is beside this Python (else on PATH), i.e. the one
ftcomm was installed with. MPICH cannot recover from a rank failure: ftcomm-run says so once,
and when a rank's end ends the job it names the rank.

The launches, relaunches and the signals that stop ftcomm-run are ``supervise``'s; the exit
statuses are listed in EPILOG (``--help``) and in the README, "Launching".
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile

from .command import agent_command, build_command, daemon_agent, default_agent, detect_mpi, mpich_ft_requested
from .signals import StopSignals
from .supervise import BACKOFF_CAP_S, first_launch, supervise
from .verdict import WOULD_REPEAT

MPICH_RECOVERY_OFF = ("ftcomm-run: MPICH: recovery is off (MPICH's ch4 device has no ULFM): the ranks run "
                      "failure-free, the recovery verbs raise UlfmUnavailableError, and a rank that dies "
                      "ends the whole job. Recovery needs Open MPI 5 (see mpi_configs/README.md).")

EPILOG = f"""\
examples:
  ftcomm-run -n 4 python train.py --epochs 3
  ftcomm-run --hostfile hosts -n 16 python train.py
  ftcomm-run --hostfile hosts -n 16 --restarts 3 python train.py     # relaunch up to 3 times
  ftcomm-run --hostfile hosts --fake-nodes --ranks-per-node 2 -n 4 --restarts 2 python train.py
  ftcomm-run --dry-run -n 4 python train.py                          # print the launcher command

--restarts N: after an abnormal end (no rank finished normally, or the launcher's status is not
  0 and no rank recovered in the job), the job is relaunched on the hosts still usable (with
  FTCOMM_RESTART=1, 2, ... for the ranks): a host whose daemon was lost is left out,
  the hostfile's other hosts (spares too) are used in order, and the world shrinks when they
  hold fewer than -n ranks. Not relaunched: a --timeout expiry, a signal to ftcomm-run, the
  program's own error on every rank, a failure before the first committed step.

exit status:
  0       every rank still alive at the end finished normally, also after ranks were lost and
          recovered in the job (--recovered-exit-code N gives N then)
  1       the job failed: a surviving rank ended by an uncaught exception, or every rank was lost
  2       bad ftcomm-run arguments
  {WOULD_REPEAT}      --restarts: not relaunched, the failure would only repeat
  124     --timeout expired; the job was killed
  128+N   ftcomm-run got signal N (SIGHUP 129, SIGINT 130, SIGTERM 143) and ended the job
  other   the MPI launcher's own non-zero status

settings: the FTCOMM_* environment variables (README, "Tuning") reach every rank; ftcomm-run
  sets FTCOMM_RUN_DIR, FTCOMM_SPARES, FTCOMM_RESTART and FTCOMM_LAUNCHER itself.
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="ftcomm-run",
        description="Launch an MPI job with ULFM fault tolerance on (Open MPI 5 by default). Everything "
                    "after the options is the program and its arguments.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
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
    p.add_argument("--timeout", type=float,
                   help="kill the whole job after this many seconds, relaunches included (exit 124)")
    p.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="relaunch a job that ended abnormally up to N times, on the hosts still usable, "
                        "with FTCOMM_RESTART=1, 2, ... (default 0: never)")
    p.add_argument("--restart-backoff", type=float, default=1.0, metavar="SECONDS",
                   help=f"wait before the first relaunch, doubling for each next one, at most "
                        f"{BACKOFF_CAP_S:g} s (default 1)")
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
    if args.restarts < 0:
        p.error("--restarts must be at least 0")
    if not args.restart_backoff >= 0:
        p.error("--restart-backoff must be at least 0 seconds")
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
    if args.restarts and args.mpi == "openmpi":
        try:  # the launch agent that records the daemon sessions can be passed to PRRTE
            agent_command(tempfile.gettempdir(), daemon_agent(args) or default_agent())
        except ValueError as exc:
            p.error(f"--restarts: {exc}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:  # launch 0's command, in a run directory that is gone at once
        with tempfile.TemporaryDirectory(prefix="ftcomm-run-") as run_dir:
            print(shlex.join(build_command(args, run_dir, first_launch(args, run_dir))))
        return 0
    if args.mpi == "mpich" and (args.no_ft or not mpich_ft_requested()):
        print(MPICH_RECOVERY_OFF, file=sys.stderr, flush=True)
    with StopSignals() as stop:
        return supervise(args, stop)


if __name__ == "__main__":
    sys.exit(main())
