"""The package's shape, checked from its source (no import of ftcomm needed, except for the
extension's stub and the settings): the layers call only downward, no module imports another in a
cycle (function-level imports included), no private name crosses a layer, the top level stays
small, the README's settings table and layout table match the code, and no comment, docstring or
doc names an issue number."""
import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ftcomm"

# Lower number = lower layer. A module may import its own layer and the layers below it.
LAYERS = {
    "ftcomm._C": 0, "ftcomm.errors": 0, "ftcomm.settings": 0, "ftcomm.segment_paths": 0,
    "ftcomm.core": 1,
    "ftcomm.membership": 2,
    "ftcomm.training": 3,
    # ftcomm.torch by concern, bottom up: the process group, ZeRO on it, the state checks, the
    # training loop; the package's own __init__ re-exports them
    "ftcomm.torch.group": 4.0, "ftcomm.torch.zero": 4.1, "ftcomm.torch.checks": 4.2, "ftcomm.torch.loop": 4.3,
    "ftcomm.torch": 4.4,
    "ftcomm.launch": 5,
    "ftcomm.goodput": 5,  # reads logs and models runs: needs no layer below
    "ftcomm": 6,  # the package's facade re-exports every layer
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    best = max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)
    return LAYERS[best]


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, list[str]]]:
    """(imported ftcomm module, names taken from it) for one import statement."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names if a.name.startswith("ftcomm")]
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    if not target.startswith("ftcomm"):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in MODULES or sub == "ftcomm._C":
            out.append((sub, []))  # importing a module from its package
        else:
            out.append((target, [alias.name]))
    return out


def import_graph() -> dict[str, dict[str, set]]:
    """module -> {imported module: names taken}, every import statement (top-level or not)."""
    graph = {}
    for module, path in MODULES.items():
        edges: dict[str, set] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, names in resolve(module, node):
                    edges.setdefault(target, set()).update(names)
        edges.pop(module, None)
        graph[module] = edges
    return graph


GRAPH = import_graph()


def test_no_import_cycle():
    """Depth-first search over the import graph (implicit parent-package imports left out)."""
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in GRAPH.get(node, {}):
            if nxt not in GRAPH:
                continue
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_layers_import_only_downward():
    upward = [(m, t) for m, edges in GRAPH.items() for t in edges if layer_of(t) > layer_of(m)]
    assert upward == []


def test_launcher_needs_only_settings():
    """ftcomm-run reads settings, starts a launcher and removes the job's node-local segments: it
    needs no communicator."""
    used = {t for m, edges in GRAPH.items() if m.startswith("ftcomm.launch") for t in edges}
    assert {t for t in used if not t.startswith("ftcomm.launch")} == {"ftcomm.settings", "ftcomm.segment_paths"}


def test_only_the_core_calls_the_extension():
    callers = sorted(m for m, edges in GRAPH.items() if "ftcomm._C" in edges)
    assert all(m.startswith("ftcomm.core") for m in callers), callers


def private_definitions(path: Path) -> set[str]:
    """Private names a module defines: functions, classes, globals, and ``self._x`` attributes."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_name_crosses_a_layer():
    """Neither ``from x import _name`` nor ``obj._name`` reaches a private name that only another
    layer defines (torch's and mpi4py's own private names are not ours to police here)."""
    defined_by_layer: dict[int, set] = {}
    for module, path in MODULES.items():
        defined_by_layer.setdefault(layer_of(module), set()).update(private_definitions(path))
    crossings = []
    for module, edges in GRAPH.items():
        for target, names in edges.items():
            if layer_of(target) != layer_of(module):
                crossings += [(module, f"{target}.{n}") for n in names if n.startswith("_")]
        mine = defined_by_layer[layer_of(module)]
        others = set().union(*(d for lay, d in defined_by_layer.items() if lay != layer_of(module)))
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.Attribute) and node.attr in others - mine:
                crossings.append((module, node.attr))
    assert crossings == []


def test_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 6, top


def test_extension_stub_names_what_the_module_defines():
    import ftcomm._C as ext

    stub = ast.parse((PACKAGE / "_C.pyi").read_text())
    in_stub = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    in_module = {n for n in dir(ext) if not n.startswith("__")}
    assert in_stub == in_module
    for cls in ("DType", "ReduceOp", "InputProblem", "FaultKind", "Tag"):
        stub_cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == cls)
        stub_values = {t.targets[0].id: ast.literal_eval(t.value) for t in stub_cls.body if isinstance(t, ast.Assign)}
        assert stub_values == {k: int(v) for k, v in getattr(ext, cls).__members__.items()}, cls
    assert (PACKAGE / "py.typed").exists()


def test_every_setting_is_read_in_settings_and_documented_once():
    """Only ftcomm/settings.py reads FTCOMM_* variables; the README's settings table lists each
    one (runtime and build-time) exactly once, and nothing else."""
    from ftcomm import settings

    readers = []
    for module, path in MODULES.items():
        if module == "ftcomm.settings":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"FTCOMM_[A-Z_]+", node.value):
                readers.append((module, node.value))
    assert readers == []
    for path in ROOT.glob("csrc/**/*"):
        if path.is_file():
            assert "getenv" not in path.read_text(), path
    table = _readme_table("Tuning")
    documented = [n for row in table for n in re.findall(r"`(FTCOMM_[A-Z_]+)`", row[0])]
    expected = set(settings.SETTINGS) | set(settings.BUILD_SETTINGS)
    assert sorted(documented) == sorted(expected), sorted(set(documented) ^ expected)
    build = (ROOT / "setup.py").read_text() + (ROOT / "buildtools" / "ftcomm_build.py").read_text()
    read_by_build = set(re.findall(r'environ(?:\.get\(|\[)"(FTCOMM_[A-Z_]+)"', build))
    assert read_by_build == set(settings.BUILD_SETTINGS)


def _readme_table(section: str) -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_readme_layout_table_matches_the_tree():
    """Every ``ftcomm/...`` folder the README's layout table names exists, and every subpackage
    and top-level module of ftcomm/ is named there."""
    table = _readme_table("Layout")
    named = {cell for row in table for cell in re.findall(r"`(ftcomm/[\w/.]*)`", row[0])}
    for name in named:
        assert (ROOT / name).exists(), name
    packages = {f"ftcomm/{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py")}
    assert packages <= named, packages - named


# "issue 8", "Issue #6", "issues 2"; not another project's tracker ("mpi-forum/mpi-issues#20").
ISSUE_REFERENCE = re.compile(r"(?<![\w/-])[Ii]ssues? ?#?\d+")


@pytest.mark.parametrize("folder", ["ftcomm", "csrc", "bindings", "docs", "tests", "examples", "benchmarks",
                                    "scripts", "mpi_configs"])
def test_no_issue_numbers_in_code_or_docs(folder):
    hits = []
    for path in sorted((ROOT / folder).rglob("*")):
        if path.is_file() and path != Path(__file__).resolve() and path.suffix in {".py", ".pyi", ".cpp", ".h", ".cu", ".cuh", ".md", ".sh", ".conf",
                                             ".env", ".sbatch", ".example"}:
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if ISSUE_REFERENCE.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    if folder == "docs":
        hits += [f"README.md: {m}" for m in ISSUE_REFERENCE.findall((ROOT / "README.md").read_text())]
    assert hits == []


def test_names_scripts_import_from_the_package_resolve():
    """The names examples, benchmarks and tests import from ``ftcomm`` (some load lazily: the
    training layer needs torch) exist; a layer move once broke ``from ftcomm import checkpoint``."""
    import ftcomm

    wanted = set()
    for folder in ("examples", "benchmarks", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "ftcomm" and node.level == 0:
                    wanted |= {alias.name for alias in node.names}
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "ftcomm" and not node.attr.startswith("_"):
                    wanted.add(node.attr)
    wanted -= {"torch"}  # a subpackage, imported as ftcomm.torch
    missing = sorted(name for name in wanted if not hasattr(ftcomm, name)
                     and importlib.util.find_spec(f"ftcomm.{name}") is None)
    assert not missing, f"ftcomm has no {missing}"
