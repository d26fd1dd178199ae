"""The packages a non-editable install (``pip install .``, a wheel) ships: every directory of
``ftcomm/`` with Python modules must be listed in pyproject.toml, or ``import ftcomm.torch`` breaks
for everyone who does not install in editable mode."""
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "ftcomm").rglob("__init__.py")}
    assert on_disk == listed, f"on disk {sorted(on_disk)}, listed {sorted(listed)}"
