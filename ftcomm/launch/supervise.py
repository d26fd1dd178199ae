"""The life of a job under ftcomm-run: a launch, and with ``--restarts N`` up to N relaunches after
abnormal ends; and what ends a launch from outside (``--timeout``, a signal to ftcomm-run).

Each launch has a run directory of its own (the ranks' pid files, exit reports and
``committed-rank*`` files; under --restarts also the daemon sessions' records and the hostfile
of a relaunch), and nothing of it is left running when the next launch starts or ftcomm-run
exits: the launcher's process group, the ranks on this host (by their pid files) and the daemon
sessions are killed.

A relaunch happens when a launch ended abnormally (``verdict.abnormal_end``) unless the failure
would only repeat (``verdict.repeat_reason``), after a backoff (``--restart-backoff``, doubling,
at most BACKOFF_CAP_S). It runs on the hosts still usable (``hosts``): those whose daemon was
lost are left out (``sessions``), the hostfile's other hosts are all candidates, and the world
shrinks when they no longer hold ``-n`` ranks. The ranks learn the launch number from
FTCOMM_RESTART, and resume from their newest complete checkpoint.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .. import settings
from .. import segment_paths
from .command import Launch, build_command, mpich_ft_requested
from .hosts import Host, capacity, fit_world, names, read_hostfile, slurm_hosts, usable_hosts, write_hostfile
from .processes import end_launcher, kill_ranks, signal_group, start_launcher
from .reports import committed_ranks, failed_ranks, mpich_failure, pid_files, read_reports, summarize
from .sessions import kill_sessions, lost_hosts, wait_for_ends
from .signals import StopSignals
from .verdict import WOULD_REPEAT, abnormal_end, backoff, repeat_reason
from .watch import FirstToEnd, Relay

TIMEOUT_STATUS = 124
# After SIGTERM, how long the launcher has to end its job before its process group gets SIGKILL.
GRACE_S = 2.0
# After the launcher's exit, how long the daemon sessions have to record their end.
SESSION_END_S = 3.0
# The longest wait between relaunches, seconds.
BACKOFF_CAP_S = 60.0


@dataclass
class Ended:
    """What one launch left behind: the launcher's exit ``status`` (negative: it was killed by that
    signal), whether ``--timeout`` expired, the ``signum`` that stopped ftcomm-run (else None),
    the ranks' exit ``reports``, the world ranks that ``committed`` a step, the ``lost`` hosts
    (their daemon session died), and for MPICH the end of the launcher's stdout and which rank
    ended first on this host."""

    run_dir: str
    status: int
    timed_out: bool
    signum: int | None
    reports: list[dict]
    committed: list[int]
    lost: set[str]
    output: str = ""
    first_ended: tuple[int, int] | None = None


def sessions_dir(args, run_dir: str) -> str | None:
    """Where the launch's daemon sessions are recorded: only under --restarts (lost hosts must be
    known to relaunch without them) and with Open MPI (mpi_configs/daemon_session.sh is an agent
    for PRRTE)."""
    if not args.restarts or args.mpi != "openmpi":
        return None
    path = os.path.join(run_dir, "daemons")
    os.makedirs(path, exist_ok=True)
    return path


def first_launch(args, run_dir: str) -> Launch:
    """Launch 0: as the arguments say."""
    return Launch(args.np, args.spares, args.hostfile, 0, sessions_dir(args, run_dir))


def job_hosts(args) -> list[Host] | None:
    """The hosts a relaunch chooses from, in order: the hostfile's, else a Slurm allocation's;
    None when they are not known here (one host; MPICH, whose lost hosts ftcomm-run cannot see):
    a relaunch then runs where the first launch did.

    Raises:
        OSError, ValueError: the hostfile cannot be read, or scontrol fails.
    """
    if not args.restarts or args.mpi != "openmpi":
        return None
    if args.hostfile:
        return read_hostfile(args.hostfile)
    return slurm_hosts()


def relaunch(args, hosts: list[Host] | None, lost: set[str], number: int, run_dir: str) -> Launch | None:
    """Relaunch number ``number`` (FTCOMM_RESTART), on the ``hosts`` not ``lost``, with a fresh
    hostfile in ``run_dir`` and as many ranks of ``-n`` as they hold (spares given up first);
    None when no host is left."""
    if hosts is None:
        return Launch(args.np, args.spares, args.hostfile, number, sessions_dir(args, run_dir))
    usable = usable_hosts(hosts, lost)
    ranks, spares = fit_world(args.np, args.spares, capacity(usable, args.ranks_per_node))
    if not usable or ranks < 1:
        return None
    hostfile = os.path.join(run_dir, "hostfile")
    write_hostfile(usable, hostfile)
    return Launch(ranks, spares, hostfile, number, sessions_dir(args, run_dir))


def _ranks_text(ranks: int, spares: int) -> str:
    """"4 ranks", "4 ranks + 1 spare"."""
    with_spares = f" + {spares} spare{'s' if spares > 1 else ''}" if spares else ""
    return f"{ranks} rank{'s' if ranks > 1 else ''}{with_spares}"


def run_launch(args, launch: Launch, run_dir: str, stop: StopSignals, deadline: float | None) -> Ended:
    """Runs one launch until the launcher exits, ``deadline`` (time.monotonic()) passes or a
    signal is caught; then makes sure nothing of it is left running."""
    mpich = args.mpi == "mpich"
    cmd = build_command(args, run_dir, launch)
    sys.stdout.flush()
    proc = start_launcher(cmd, stdout=subprocess.PIPE if mpich else None)
    relay = Relay(proc.stdout) if mpich else None
    watch = FirstToEnd(run_dir, launch.ranks + launch.spares) if mpich and hasattr(os, "pidfd_open") else None
    for thread in (relay, watch):
        if thread:
            thread.start()
    exited = stop.wait(proc, None if deadline is None else max(0.0, deadline - time.monotonic()))
    timed_out = False
    if stop.signum is not None and not exited:
        status = end_launcher(proc, GRACE_S)
    elif not exited:
        print(f"ftcomm-run: --timeout {args.timeout:g} s expired; killing the job", file=sys.stderr)
        signal_group(proc, signal.SIGKILL)
        proc.wait()
        status, timed_out = TIMEOUT_STATUS, True
    else:
        status = proc.returncode
    output, first_ended = relay.text() if relay else "", watch.result() if watch else None
    lost = set()
    if launch.sessions_dir and exited and stop.signum is None:
        lost = lost_hosts(wait_for_ends(launch.sessions_dir, SESSION_END_S))
    kill_ranks(run_dir)  # Open MPI starts ranks outside the launcher's process group
    if launch.sessions_dir:
        kill_sessions(launch.sessions_dir)
    return Ended(run_dir, status, timed_out, stop.signum, read_reports(run_dir), committed_ranks(run_dir), lost,
                 output, first_ended)


def final_status(args, launch: Launch, ended: Ended) -> int:
    """ftcomm-run's exit status for the launch that ends the run, with its summary line on stderr
    (the rules of the README's "Exit status")."""
    if ended.timed_out:
        return TIMEOUT_STATUS
    rc, mpich = ended.status, args.mpi == "mpich"
    finished, lost = summarize(ended.run_dir, launch.ranks + launch.spares, ended.reports)
    crashed = failed_ranks(ended.reports)
    if mpich and rc != 0:  # name what ended the job: mpiexec's own report may not
        ended_by = (f"world rank(s) {crashed} ended by an uncaught exception" if crashed
                    else mpich_failure(ended.first_ended, ended.output))
        if args.no_ft or not mpich_ft_requested():
            print(f"ftcomm-run: {ended_by}; MPICH cannot recover from a rank failure (no ULFM), so the whole "
                  "job was ended. Recovery needs Open MPI 5 (see mpi_configs/README.md).", file=sys.stderr)
        else:
            print(f"ftcomm-run: {ended_by}", file=sys.stderr)
    if rc == 0 and crashed:  # e.g. MPI_Finalize overran after the error and the rank exited 0
        print(f"ftcomm-run: job failed: world rank(s) {crashed} ended by an uncaught exception", file=sys.stderr)
        return 1
    if ended_well_without_ftcomm(ended):
        return 0
    if rc == 0 and lost and not finished:  # every rank was lost: nothing recovered
        print(f"ftcomm-run: job failed: all {launch.ranks} ranks lost", file=sys.stderr)
        return 1
    if rc == 0 and lost:
        print(f"ftcomm-run: job recovered: {len(finished)} of {launch.ranks + launch.spares} processes finished, "
              f"lost world rank(s) {lost}", file=sys.stderr)
        return args.recovered_exit_code
    return rc


def ended_well_without_ftcomm(ended: Ended) -> bool:
    """True when the launcher exited 0 after running a program that never imported ftcomm (a
    plain mpi4py script, a compiled MPI program): no rank published its pid or left an exit
    report, and no host was lost. Nothing then says that a rank was lost: the job succeeded."""
    return ended.status == 0 and not ended.reports and not pid_files(ended.run_dir) and not ended.lost


def supervise(args, stop: StopSignals) -> int:
    """Runs the job of the parsed arguments ``args`` (launches and relaunches) and returns
    ftcomm-run's exit status. Every run directory is removed at the end."""
    run_dirs: list[str] = []
    try:
        return _launches(args, stop, run_dirs)
    finally:
        for run_dir in run_dirs:
            shutil.rmtree(run_dir, ignore_errors=True)
        segment_paths.remove_job(own_job_key())  # this host's segments: nothing will resume from them


def own_job_key() -> str:
    """The key under which this ftcomm-run's ranks keep their node-local segments (the
    ``settings.job_id`` they derive from the FTCOMM_LAUNCHER it gave them)."""
    return settings.job_id_of(*settings.this_launcher())


def _launches(args, stop: StopSignals, run_dirs: list[str]) -> int:
    def new_run_dir() -> str:
        # Each at the top of the temporary folder: on another host a rank makes its run
        # directory with a single mkdir (csrc/core/liveness.cpp).
        run_dirs.append(tempfile.mkdtemp(prefix="ftcomm-run-"))
        return run_dirs[-1]

    try:
        hosts = job_hosts(args)
    except (OSError, ValueError) as exc:
        print(f"ftcomm-run: cannot list the job's hosts for --restarts: {exc}", file=sys.stderr)
        return 2
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    run_dir = new_run_dir()
    launch, lost, number = first_launch(args, run_dir), set(), 0
    while True:
        ended = run_launch(args, launch, run_dir, stop, deadline)
        if ended.signum is not None:
            print(f"ftcomm-run: {signal.Signals(ended.signum).name}: ended the job", file=sys.stderr)
            return 128 + ended.signum
        why = None if ended.timed_out or ended_well_without_ftcomm(ended) else abnormal_end(ended.status, ended.reports)
        if why is None or number == args.restarts:
            return _said(args, number, final_status(args, launch, ended))
        lost |= ended.lost
        if ended.lost:
            why += f"; lost host(s) {', '.join(sorted(ended.lost))}"
        repeats = repeat_reason(ended.reports, bool(ended.committed), ended.lost)
        if repeats:
            print(f"ftcomm-run: job ended abnormally ({why}); not relaunching: {repeats}, which a relaunch would "
                  f"only repeat (exit status {WOULD_REPEAT})", file=sys.stderr)
            return WOULD_REPEAT
        number += 1
        if args.fake_nodes:
            for host in ended.lost:  # a made-up node's memory lives on: it must be gone as a real one's is
                segment_paths.remove_node(host, own_job_key())
        run_dir = new_run_dir()
        nxt = relaunch(args, hosts, lost, number, run_dir)
        if nxt is None:
            print(f"ftcomm-run: job ended abnormally ({why}); no usable host left to relaunch on", file=sys.stderr)
            return _said(args, number - 1, final_status(args, launch, ended))
        if (nxt.ranks, nxt.spares) != (args.np, args.spares):
            print(f"ftcomm-run: the usable hosts hold {_ranks_text(nxt.ranks, nxt.spares)}, not "
                  f"{_ranks_text(args.np, args.spares)}: the relaunch runs with fewer", file=sys.stderr)
        delay = backoff(number, args.restart_backoff, BACKOFF_CAP_S)
        where = f"hosts {names(usable_hosts(hosts, lost))}" if hosts is not None else "the same hosts"
        print(f"ftcomm-run: job ended abnormally ({why}); relaunch {number} of {args.restarts} in {delay:.1f} s "
              f"on {where} ({_ranks_text(nxt.ranks, nxt.spares)})", file=sys.stderr, flush=True)
        stop.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
        if stop.signum is not None:
            print(f"ftcomm-run: {signal.Signals(stop.signum).name}: no relaunch", file=sys.stderr)
            return 128 + stop.signum
        if deadline is not None and time.monotonic() >= deadline:
            print(f"ftcomm-run: --timeout {args.timeout:g} s expired before the relaunch", file=sys.stderr)
            return _said(args, number - 1, TIMEOUT_STATUS)
        launch = nxt


def _said(args, relaunches: int, status: int) -> int:
    """Prints the final status line under --restarts; returns ``status``."""
    if args.restarts:
        print(f"ftcomm-run: exit status {status} after {relaunches} relaunch(es)", file=sys.stderr)
    return status
