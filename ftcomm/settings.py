"""Every ``FTCOMM_*`` environment variable ftcomm reads, with its default, unit and meaning.

This is the one module that reads them: the other modules call the functions below, and the
C++ core gets its part through ``ftcomm._C.configure`` (``ftcomm.core.runtime``). The README's
settings table lists the same names (``tests/unit/test_layers.py`` compares the two). Values are
read when asked for, so a test or a script may set a variable after ``import ftcomm``; the core's
part is read once, at import.

Build-time variables (``FTCOMM_MPI``, ``FTCOMM_CUDA``, ``FTCOMM_CUDA_ARCHS``) are read by the build
(``buildtools/ftcomm_build.py``, ``setup.py``), which runs before this package exists; they are in
the README's table too.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Callable

_FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``name``, ``default`` (used when unset or empty), ``parse`` (text
    to value; raises ValueError on bad text), ``meaning`` (one line, for errors and docs)."""

    name: str
    default: object
    parse: Callable[[str], object]
    meaning: str

    def text(self) -> str | None:
        """The variable's text, or None when it is unset or empty."""
        value = os.environ.get(self.name)
        return value if value not in (None, "") else None

    def get(self):
        """The parsed value, or ``default``.

        Raises:
            ValueError: the text does not parse (the message names the variable and its text).
        """
        text = self.text()
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"{self.name}={text!r}: {exc} ({self.meaning})") from None


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be a positive number of seconds")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be a non-negative integer")
    return value


def _flag(text: str) -> bool:
    return text.strip().lower() not in _FALSE_WORDS


def _word(choices: tuple) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = text.strip().lower()  # "NCCL" as torch's backend names are written, too
        if word not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return word

    return parse


def _launcher_identity(text: str) -> tuple[str, int, int]:
    host, pid, start = text.rsplit(":", 2)
    if not host or int(pid) <= 0 or int(start) < 0:
        raise ValueError("must be HOST:PID:START")
    return host, int(pid), int(start)


SETTINGS: dict[str, Setting] = {}


def _define(name: str, default, parse, meaning: str) -> Setting:
    SETTINGS[name] = Setting(name, default, parse, meaning)
    return SETTINGS[name]


TIMEOUT = _define("FTCOMM_TIMEOUT", 600.0, _seconds, "seconds any blocking call may take")
CHUNK_BYTES = _define("FTCOMM_CHUNK_BYTES", 1 << 20, _count, "ring allreduce pipelining chunk, bytes")
FENCE_TIMEOUT = _define("FTCOMM_FENCE_TIMEOUT", None, _seconds,
                        "seconds without a process heartbeat after which a waiting rank fences a peer "
                        "(default FTCOMM_TIMEOUT, at most 10)")
LATE_RANK = _define("FTCOMM_LATE_RANK", "fence", _word(("fence", "raise")),
                    "what happens to a live rank that misses a collective's deadline: fence or raise")
FINALIZE_TIMEOUT = _define("FTCOMM_FINALIZE_TIMEOUT", 30.0, _seconds,
                           "seconds MPI_Finalize may take at exit before the rank just exits")
JOIN_TIMEOUT = _define("FTCOMM_JOIN_TIMEOUT", 600.0, _seconds,
                       "seconds the survivors of a torch job wait for a promoted spare to reach the hand-over")
SPARES = _define("FTCOMM_SPARES", 0, _count, "idle spare ranks at the end of MPI_COMM_WORLD (set by ftcomm-run)")
RECOVERY_POLICY = _define("FTCOMM_RECOVERY_POLICY", None, _word(("shrink", "spares", "respawn")),
                          "what recover() does without a policy")
RESPAWN = _define("FTCOMM_RESPAWN", None, _word(("force",)), "force: try MPI_Comm_spawn on Open MPI 5.0.x too")
PROFILE = _define("FTCOMM_PROFILE", False, _flag, "print each allreduce step's phase times to stderr")
CHECKSUMS = _define("FTCOMM_CHECKSUMS", False, _flag,
                    "check every ring chunk's checksum before an allreduce commits (silent data corruption)")
FINGERPRINTS = _define("FTCOMM_FINGERPRINTS", False, _flag,
                       "compare a fingerprint of every rank's allreduce result before the commit (silent data corruption)")
STEP_COMMIT = _define("FTCOMM_STEP_COMMIT", True, _flag,
                      "commit a resilient step's gradient allreduces (those of backward) with one agreement before the optimizer step")
DATA_PLANE = _define("FTCOMM_DATA_PLANE", "ring", _word(("ring", "gloo", "nccl")),
                     "what moves a resilient step's gradient buckets: ftcomm's ring, an inner gloo group, "
                     "or an inner NCCL group (CUDA tensors)")
RUN_DIR = _define("FTCOMM_RUN_DIR", None, str, "ftcomm-run's run directory (liveness table, exit reports)")
FAULT = _define("FTCOMM_FAULT", "", str, "fault injection specs (ftcomm.fault)")
NODE = _define("FTCOMM_NODE", None, str, "this rank's node name, for node-aware buddy placement")
FAKE_NODE = _define("FTCOMM_FAKE_NODE", None, str, "node name set by ftcomm-run --fake-nodes")
NODE_AWARE = _define("FTCOMM_NODE_AWARE", True, _flag, "place replicas on other nodes than their owners")
TORCH_ENV = _define("FTCOMM_TORCH_ENV", True, _flag,
                    "import ftcomm.torch fills in RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from MPI")
TORCH_ASYNC = _define("FTCOMM_TORCH_ASYNC", True, _flag,
                      "run the torch backend's collectives on ftcomm's communication thread")
RESTART = _define("FTCOMM_RESTART", 0, _count,
                  "how many times ftcomm-run --restarts has relaunched this job (0: the first launch; set by ftcomm-run)")
LAUNCHER = _define("FTCOMM_LAUNCHER", None, _launcher_identity,
                   "ftcomm-run's HOST:PID:START (set by ftcomm-run): a rank on that host ends when it is gone")
WARM = _define("FTCOMM_WARM", True, _flag,
               "under ftcomm-run: keep committed shards and replicas in node-local shared memory, for a relaunch to resume from")
SHM_DIR = _define("FTCOMM_SHM_DIR", "/dev/shm", str, "where the node-local shared memory segments go (a tmpfs)")
MTBF = _define("FTCOMM_MTBF", None, _seconds,
               "mean seconds between failures that end the whole job, for checkpoint_every=\"auto\" (Young/Daly)")

# Read by the build (buildtools/ftcomm_build.py, setup.py); documented here so that the README's
# table can be checked.
BUILD_SETTINGS = ("FTCOMM_MPI", "FTCOMM_CUDA", "FTCOMM_CUDA_ARCHS")


# -- what the other modules call --------------------------------------------------------------
def default_timeout() -> float:
    """FTCOMM_TIMEOUT: deadline of every blocking call, in seconds (default 600, torch's default
    for NCCL groups: long enough for an evaluation or a checkpoint on one rank while the others
    wait; a stopped or dead rank is found by the heartbeat and ULFM, not by this)."""
    return TIMEOUT.get()


def timeout_is_set() -> bool:
    """True when FTCOMM_TIMEOUT is set (it then overrides the timeout torch passes)."""
    return TIMEOUT.text() is not None


def resolve_timeout(timeout) -> float:
    """``timeout`` in seconds as a float, or FTCOMM_TIMEOUT when None.

    Raises:
        ValueError: ``timeout`` is not a positive number.
    """
    try:
        value = default_timeout() if timeout is None else float(timeout)
    except (TypeError, ValueError):
        value = float("nan")  # refused below, with the value named
    if not value > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return value


def chunk_bytes() -> int:
    """FTCOMM_CHUNK_BYTES: ring allreduce chunk size in bytes (default 1 MiB)."""
    return CHUNK_BYTES.get()


def fence_timeout() -> float:
    """FTCOMM_FENCE_TIMEOUT: seconds without a process heartbeat (a thread of each rank beats
    every 100 ms, whatever the rank is doing) after which a waiting rank fences a peer on its
    host: the peer is stopped, frozen or dead. Default FTCOMM_TIMEOUT, at most 10 s."""
    value = FENCE_TIMEOUT.get()
    return min(default_timeout(), 10.0) if value is None else value


def late_rank_fence() -> bool:
    """FTCOMM_LATE_RANK: "fence" (default): a live rank that has not arrived in a collective by
    its deadline (busy outside ftcomm, or hung inside it) is fenced like a dead one, and the
    survivors go on; "raise": it is only named in the CollectiveTimeoutError of the ranks that
    waited for it (no agreement is possible without it, so the outcome is local and the
    communicator is left revoked). A stopped rank (no heartbeat) is fenced under either. Unset,
    the torch backend fences late ranks only inside a resilient loop
    (ftcomm/torch/group/late_rank.py)."""
    return LATE_RANK.get() == "fence"


def late_rank_is_set() -> bool:
    """True when FTCOMM_LATE_RANK is set (the torch backend then keeps it everywhere)."""
    return LATE_RANK.text() is not None


def finalize_timeout() -> float:
    """FTCOMM_FINALIZE_TIMEOUT: seconds MPI_Finalize may take at exit (default 30)."""
    return FINALIZE_TIMEOUT.get()


def join_timeout() -> float:
    """FTCOMM_JOIN_TIMEOUT: seconds the survivors of a torch job wait for a promoted spare to
    start (imports, data set, model) and reach the hand-over (default 600)."""
    return JOIN_TIMEOUT.get()


def spares() -> int:
    """FTCOMM_SPARES: idle spare ranks at the end of MPI_COMM_WORLD (``ftcomm-run --spares S``)."""
    return SPARES.get()


def recovery_policy(default: str = "shrink") -> str:
    """FTCOMM_RECOVERY_POLICY: what ``Communicator.recover()`` does without a policy ("shrink",
    "spares" or "respawn"); ``default`` when unset."""
    value = RECOVERY_POLICY.get()
    return default if value is None else value


def respawn_forced() -> bool:
    """FTCOMM_RESPAWN=force: try MPI_Comm_spawn even where ftcomm knows it to be unreliable."""
    return RESPAWN.get() == "force"


def checksums() -> bool:
    """FTCOMM_CHECKSUMS: the allreduce's transit guard, on or off (default off); must be the same
    on every rank."""
    return CHECKSUMS.get()


def step_commit() -> bool:
    """FTCOMM_STEP_COMMIT: inside a resilient training step, the torch backend's allreduces issued
    during backward (DDP's buckets) run uncommitted and commit together with one agreement before
    the optimizer step (default on); off, each commits on its own. Must be the same on every rank."""
    return STEP_COMMIT.get()


def buckets_on_data_plane(plane: str | None = None) -> bool:
    """Whether a resilient step's gradient buckets go through the data plane ``plane`` ("ring",
    "gloo", "nccl"; default FTCOMM_DATA_PLANE's, a process group's own is the one it was made
    with): the step commit is on (``FTCOMM_STEP_COMMIT``), the transit guard off
    (``FTCOMM_CHECKSUMS``: it checks the ring's chunks in each ring allreduce's own agreement), and,
    on the ring plane, the result fingerprints off too (``FTCOMM_FINGERPRINTS``: the ring compares
    them in each allreduce's own agreement, with the transit guard; the gloo and NCCL planes
    compare them in the step's agreement). Otherwise each bucket is committed on its own by
    ftcomm's ring."""
    name = data_plane() if plane is None else plane
    return step_commit() and not checksums() and (not fingerprints() or name != "ring")


def data_plane() -> str:
    """FTCOMM_DATA_PLANE: what moves the gradient buckets that a resilient step's backward
    allreduces uncommitted (``FTCOMM_STEP_COMMIT``): "ring" (default, ftcomm's ring over the
    communicator; CUDA tensors staged through host memory), "gloo" (an inner torch gloo group over
    the same ranks, rebuilt after each recovery, host and CUDA tensors) or "nccl" (an inner torch
    NCCL group for CUDA tensors, host tensors on the ring; the ring where NCCL cannot run). The
    step's one agreement over the communicator commits them. Must be the same on every rank."""
    return DATA_PLANE.get()


def fingerprints() -> bool:
    """FTCOMM_FINGERPRINTS: the allreduce's result fingerprints, on or off (default off); must be the
    same on every rank."""
    return FINGERPRINTS.get()


def profile() -> bool:
    """FTCOMM_PROFILE: print each allreduce step's validate / ring / agree times to stderr."""
    return PROFILE.get()


def run_dir() -> str | None:
    """FTCOMM_RUN_DIR: the run directory ftcomm-run made for this job, or None."""
    return RUN_DIR.get()


def fault_specs() -> str:
    """FTCOMM_FAULT: fault injection specs (syntax in ftcomm.core.fault); "" when unset."""
    return FAULT.get()


def node_name_override() -> str | None:
    """FTCOMM_NODE, else FTCOMM_FAKE_NODE: this rank's node name when set, else None."""
    return NODE.get() or FAKE_NODE.get()


def node_aware() -> bool:
    """FTCOMM_NODE_AWARE: place replicas on other nodes than their owners (default on)."""
    return NODE_AWARE.get()


def torch_env() -> bool:
    """FTCOMM_TORCH_ENV: ``import ftcomm.torch`` fills in torch's rendezvous variables (default on)."""
    return TORCH_ENV.get()


def torch_async() -> bool:
    """FTCOMM_TORCH_ASYNC: the torch backend runs collectives on its own thread (default on)."""
    return TORCH_ASYNC.get()


def restart_count() -> int:
    """FTCOMM_RESTART: the launch number ``ftcomm-run --restarts`` gives the ranks (0 on the first
    launch, k on the k-th relaunch); 0 outside ftcomm-run."""
    return RESTART.get()


def mtbf() -> float | None:
    """FTCOMM_MTBF: mean time between the failures that end the whole job (a lost node, the
    launcher killed), in seconds, for ``checkpoint_every="auto"``; None when unset."""
    return MTBF.get()


def warm_restart() -> bool:
    """FTCOMM_WARM: committed shards and replicas in node-local shared memory (default on; it
    takes effect only under ftcomm-run, whose relaunches read them)."""
    return WARM.get()


def shm_dir() -> str:
    """FTCOMM_SHM_DIR: the tmpfs for node-local segments (default /dev/shm)."""
    return SHM_DIR.get()


def launcher() -> tuple[str, int, int] | None:
    """FTCOMM_LAUNCHER: (host name, pid, start time in clock ticks after boot) of the ftcomm-run
    process that started this rank, or None outside ftcomm-run. A rank on that host ends itself
    when that process is gone (``ftcomm.core.runtime``)."""
    return LAUNCHER.get()


def job_id() -> str | None:
    """A name for the job that ftcomm-run started, the same in each of its relaunches
    (FTCOMM_LAUNCHER's host, pid and start time: a pid is reused, a pid and its start time are
    not), or None outside ftcomm-run. Node-local segments and the examples' event logs use it."""
    found = launcher()
    return None if found is None else job_id_of(*found)


def job_id_of(host: str, pid: int, start: int) -> str:
    """``job_id`` of the ftcomm-run process ``pid`` on ``host`` started at ``start`` (clock ticks
    after boot), as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{host}-{pid}-{start}")


def this_launcher() -> tuple[str, int, int]:
    """This process as FTCOMM_LAUNCHER names a launcher: (host name, pid, start time)."""
    return socket.gethostname(), os.getpid(), process_start_time(os.getpid()) or 0


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (field 22 of /proc/PID/stat), or
    None when there is no such process (or no /proc). With the pid it names one process for
    good: a pid is reused, a pid and its start time are not. FTCOMM_LAUNCHER carries both."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


# -- variables ftcomm sets ----------------------------------------------------------------------
def launcher_environment(run_dir_path: str, spare_count: int, restart: int = 0) -> dict[str, str]:
    """The variables ``ftcomm-run`` sets for every rank of the job it starts: the run directory,
    the spare count (when there are spares), the launch number ``restart`` (0 on the first
    launch, k on the k-th relaunch of ``--restarts``) and who launched it (this process)."""
    env = {RUN_DIR.name: run_dir_path}
    if spare_count:
        env[SPARES.name] = str(spare_count)
    env[RESTART.name] = str(restart)
    env[LAUNCHER.name] = ":".join(map(str, this_launcher()))
    return env


def forwarded_names() -> list[str]:
    """Names of the FTCOMM_* variables set in this environment that the launcher forwards to the
    ranks (every one but those it sets itself)."""
    own = {RUN_DIR.name, SPARES.name, RESTART.name, LAUNCHER.name}
    return sorted(n for n in os.environ if n.startswith("FTCOMM_") and n not in own)


def forget_job_settings() -> None:
    """In a process that MPI_Comm_spawn started: drop the settings that belong to the first job
    (its run directory, fault plan and spare count), since this process's MPI_COMM_WORLD ranks
    start at 0 again and would take the first job's world rank 0's place in them."""
    for setting in (RUN_DIR, FAULT, SPARES):
        os.environ.pop(setting.name, None)
