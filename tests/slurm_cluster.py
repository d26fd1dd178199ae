"""A one-node Slurm cluster on this machine, for tests/integration/test_slurm.py: munged, slurmctld
and slurmd (Debian's ``slurm-wlm``, 22.05 here) run in the foreground as children of the test,
with every file of theirs (slurm.conf, munge key and socket, state, spool, logs) in one
temporary folder, and on ports of their own, so they disturb nothing of the machine's.

Settings that work in a container: no cgroups (``proctrack/linuxproc`` tracks a job's processes
by their parents, ``task/none``, no accounting), and one node, named as this host (``hostname
-s``: Open MPI's mpirun inside the allocation must see the allocated node as its own host), that
claims more CPUs than the machine has (``config_overrides``), so a 4-rank job fits on 2 cores.

``SlurmCluster.start`` raises ``Unavailable`` with the reason when not root, when the daemons are
not installed or when the node does not become idle in time; ``stop`` ends the daemons and every
process that carries the cluster's marker in its environment (jobs' processes and slurmstepd
included).
"""
from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import live_processes

SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scancel", "scontrol", "sinfo")
# The environment variable, set in the daemons' and the jobs' environment, that lets ``stop``
# find every process of this cluster.
MARKER = "FTCOMM_SLURM_TEST_CLUSTER"
# How many CPUs the node claims (the machine may have fewer: config_overrides).
NODE_CPUS = 8
# A job state that will not change any more.
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE")


# prctl(2): the signal a process gets when the thread that forked it ends.
_PR_SET_PDEATHSIG = 1
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: nothing may be loaded after fork
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the daemon gets SIGKILL when the test process ends, even by SIGKILL (when no
    finalizer runs)."""
    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the test process died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


class Unavailable(Exception):
    """The cluster cannot run here; the message says why."""


def find_program(name: str) -> str | None:
    """``name`` on PATH, else in the sbin folders (not on a normal user's PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN_DIRS:
        path = Path(folder) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def free_port() -> int:
    """A TCP port no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked_processes(marker: str, name: str = MARKER) -> list[int]:
    """Pids of running processes (zombies aside) whose environment has ``name=marker``."""
    wanted = f"{name}={marker}".encode()
    return [pid for pid, _, environ in live_processes() if wanted in environ.split(b"\0")]


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class SlurmCluster:
    """munged, slurmctld and slurmd in ``root`` (made when None). Use ``start()``, then the client
    helpers, and always ``stop()``."""

    def __init__(self, root: str | None = None):
        # Short: the munge socket's path must fit a sockaddr_un (108 bytes).
        self.root = Path(root or tempfile.mkdtemp(prefix="ftcomm-slurm-"))
        self.node = socket.gethostname().split(".", 1)[0]
        self.conf = self.root / "slurm.conf"
        self.marker = self.root.name
        self.procs: dict[str, subprocess.Popen] = {}
        self.programs: dict[str, str] = {}

    # -- environment ------------------------------------------------------------------------------
    def env(self, extra: dict | None = None, base: dict | None = None) -> dict:
        """``base`` (default: this process's environment) for a Slurm client or a job: without the
        SLURM_* variables of an enclosing allocation, with SLURM_CONF and the cluster's marker
        (which jobs inherit: sbatch exports the environment), and ``extra``."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env[MARKER] = self.marker
        for folder in SBIN_DIRS:  # scontrol etc. for the jobs too
            if folder not in env.get("PATH", "").split(os.pathsep):
                env["PATH"] = env.get("PATH", "") + os.pathsep + folder
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def run(self, *cmd: str, timeout: float = 30, env: dict | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command (``sinfo``...) against this cluster, with a hard timeout."""
        return subprocess.run([self.programs.get(cmd[0], cmd[0]), *cmd[1:]], capture_output=True, text=True,
                              timeout=timeout, env=self.env(env), stdin=subprocess.DEVNULL, cwd=self.root)

    # -- start and stop ---------------------------------------------------------------------------
    def _write_files(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o755)  # munged refuses a socket folder others can write to
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        user = pwd.getpwuid(os.getuid()).pw_name
        r = self.root
        lines = [
            "ClusterName=ftcommtest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/munge.socket",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            f"PlugStackConfig={r}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MailProg=/bin/true",
            # scancel: SIGTERM to every process of the job, SIGKILL this long after; above the
            # test's own bound, so what ends the job in time is ftcomm-run's handling of SIGTERM.
            "KillWait=30",
            "MinJobAge=600",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "plugstack.conf").write_text("")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        env = self.env()
        self.procs[name] = subprocess.Popen([self.programs[name], *args], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, cwd=self.root, start_new_session=True,
                                            preexec_fn=_die_with_parent(os.getpid()))
        log.close()

    def _why_not(self, what: str) -> str:
        r = self.root / "log"
        ended = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
        return (f"{what}; daemons that exited: {ended or 'none'}\n"
                f"--- munged ---\n{_tail(r / 'munged.log')}\n{_tail(r / 'munged.out', 500)}\n"
                f"--- slurmctld ---\n{_tail(r / 'slurmctld.log')}\n{_tail(r / 'slurmctld.out', 500)}\n"
                f"--- slurmd ---\n{_tail(r / 'slurmd.log')}\n{_tail(r / 'slurmd.out', 500)}")

    def start(self, timeout: float = 60) -> None:
        """Starts the three daemons and waits (at most ``timeout`` s) until ``sinfo`` shows the
        node idle.

        Raises:
            Unavailable: a program is missing, a daemon exited, or the node did not become idle.
        """
        if os.geteuid() != 0:  # slurmd starts each job as its user; untried without root here
            raise Unavailable(f"slurmd needs root to run jobs; this is uid {os.geteuid()}")
        missing = [name for name in DAEMONS + CLIENTS if not find_program(name)]
        if missing:
            raise Unavailable(f"not installed: {', '.join(missing)} (Debian: apt-get install slurm-wlm)")
        self.programs = {name: find_program(name) for name in DAEMONS + CLIENTS}
        self._write_files()
        m = self.root / "munge"
        self._spawn("munged", "--foreground", "--force", f"--key-file={m}/munge.key", f"--socket={m}/munge.socket",
                    f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed",
                    f"--log-file={self.root}/log/munged.log")
        deadline = time.monotonic() + 15
        while not (m / "munge.socket").exists() and time.monotonic() < deadline:
            if self.procs["munged"].poll() is not None:
                raise Unavailable(self._why_not("munged exited"))
            time.sleep(0.1)
        if not (m / "munge.socket").exists():
            raise Unavailable(self._why_not("munged made no socket in 15 s"))
        self._spawn("slurmctld", "-D", "-c", "-i", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf), "-N", self.node)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name in ("slurmctld", "slurmd"):
                if self.procs[name].poll() is not None:
                    raise Unavailable(self._why_not(f"{name} exited with status {self.procs[name].returncode}"))
            try:
                done = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=15)
                state = (done.stdout + done.stderr).strip()
            except subprocess.TimeoutExpired:
                state = "sinfo took over 15 s"
            if state == f"{self.node} idle":
                return
            time.sleep(0.5)
        raise Unavailable(self._why_not(f"the node was not idle within {timeout:g} s (sinfo: {state!r})"))

    def stop(self) -> list[int]:
        """Ends the daemons, then every process left with the cluster's marker (a job's processes,
        slurmstepd); removes the folder. Returns the pids it had to kill after the daemons."""
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        killed = marked_processes(self.marker)
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
        return killed

    # -- jobs -------------------------------------------------------------------------------------
    def submit(self, *args: str, env: dict | None = None, base: dict | None = None, cwd: str | None = None) -> int:
        """``sbatch --parsable ARGS`` in ``cwd``, the job's environment made by ``env(env, base)``;
        returns the job id.

        Raises:
            RuntimeError: sbatch failed (its error in the message).
        """
        done = subprocess.run([self.programs["sbatch"], "--parsable", *args], capture_output=True, text=True,
                              timeout=30, env=self.env(env, base), stdin=subprocess.DEVNULL, cwd=cwd or self.root)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` of ``job_id`` as a dict (JobState, ExitCode, ...); {} when unknown."""
        done = self.run("scontrol", "-o", "show", "job", str(job_id), timeout=15)
        fields = {}
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_job(self, job_id: int, timeout: float, states=FINAL_STATES) -> dict[str, str]:
        """Polls the job until its state is one of ``states``; returns its fields.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the job is cancelled first).
        """
        deadline = time.monotonic() + timeout
        fields = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(0.5)
        self.run("scancel", str(job_id))
        raise TimeoutError(f"job {job_id} not in {states} within {timeout:g} s: {fields}")

    def logs(self) -> str:
        """The end of slurmctld's and slurmd's logs, for a failure's message."""
        return self._why_not("logs")
