"""A source tree in the current folder that hides the ftcomm an environment installed is named as
the cause when the compiled core does not match the MPI (ftcomm/core/runtime.py), instead of a
bare "built against another MPI... Rebuild"."""
import importlib.metadata
from pathlib import Path

from ftcomm.core import runtime

TREE = Path(runtime.__file__).resolve().parents[1]  # the ftcomm package imported here


class _Dist:
    def __init__(self, direct_url=None, site=None):
        self.direct_url, self.site = direct_url, site
        self.files = ["ftcomm/__init__.py"] if site else []

    def read_text(self, name):
        return self.direct_url if name == "direct_url.json" else None

    def locate_file(self, name):
        return Path(self.site) / name


def _with(monkeypatch, dist):
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
    return runtime.shadowing_source_tree()


def test_an_editable_install_of_another_tree_is_named(monkeypatch, tmp_path):
    said = _with(monkeypatch, _Dist(direct_url=f'{{"url": "file://{tmp_path}", "dir_info": {{"editable": true}}}}'))
    assert said is not None and str(TREE) in said and str(tmp_path / "ftcomm") in said
    assert "run from another folder" in said
    assert runtime._mismatch("Rebuild it").startswith(said) and said in runtime._mismatch("Rebuild it")


def test_a_site_packages_install_hidden_by_the_tree_is_named(monkeypatch, tmp_path):
    said = _with(monkeypatch, _Dist(site=tmp_path / "site-packages"))
    assert said is not None and str(tmp_path / "site-packages" / "ftcomm") in said


def test_the_installed_tree_itself_is_no_cause(monkeypatch):
    assert _with(monkeypatch, _Dist(direct_url=f'{{"url": "file://{TREE.parent}", "dir_info": {{"editable": true}}}}')) is None
    assert runtime._mismatch("Rebuild it") == "Rebuild it"
