"""The layout holds: every module imports on its own, and nothing imports in a circle.

Two checks over the product's source (not tests):

- every module is imported in an interpreter where no other module of the project has been
  imported before it (a fork of one clean interpreter per module), so a module that works only
  because some other one happened to be imported first fails here;
- the import graph, read with ``ast`` from the source (imports inside functions and under
  ``TYPE_CHECKING`` included: a lazy import is still a circle in the design), has no cycle
  between modules, none between packages side by side (``package_graph``), and the boundaries of docs/architecture.md hold: gateway, analytics and evals never
  import each other; contracts imports none of them; serving imports nothing of the project.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "serving", "gateway", "analytics", "evals", "liftgate")
# The code sandbox's programs run in their own interpreter (python -I -S) with their folder
# as the whole path, importing each other by bare name: they are never imported as part of
# the package (evals.scorers.sandbox.runner starts them as scripts).
SANDBOX_SCRIPTS = frozenset(f"evals.scorers.sandbox.{m}" for m in ("harness", "worker", "wire", "confine"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    """Every Python module of the product packages: dotted name -> file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(path)] = path
    return out


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The project module that importing ``name`` runs (itself, or the package it names)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The project modules ``module`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import name``: the submodule pkg.name when there is one, else pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            found = _resolve(t, modules)
            if found is not None and found != module:
                out.add(found)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one node (the cycles), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between siblings: each edge seen from the package both ends share.

    An import from ``a.b.x`` of ``a.c.y`` is an edge ``a.b -> a.c`` (subpackage to
    subpackage); of ``a.z``, ``a.b -> a.z`` (a subpackage using a module of its parent). A
    package importing its own modules is inside itself and no edge. A cycle in this graph is
    a cycle between modules or packages that sit side by side.
    """
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        pa = a.split(".")
        for b in targets:
            pb = b.split(".")
            k = 0
            while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
                k += 1
            if k == len(pa) or k == len(pb):
                continue  # one contains the other
            out.setdefault(".".join(pa[: k + 1]), set()).add(".".join(pb[: k + 1]))
    return out


def _edges_within(graph: Mapping[str, set[str]], comp: list[str]) -> list[str]:
    members = set(comp)
    return [f"{a} -> {b}" for a in comp for b in sorted(graph.get(a, set()) & members)]


def test_the_cycle_finder_finds_a_circle_and_passes_a_tree() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_imports_are_read_from_functions_type_checking_blocks_and_relative_forms(tmp_path: Path) -> None:
    modules = {"p": tmp_path / "__init__.py", "p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    modules["p"].write_text("")
    modules["p.b"].write_text("")
    modules["p.a"].write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from p.b import x
            def f():
                from . import b
            """
        )
    )
    assert imports_of("p.a", modules["p.a"], modules) == {"p.b"}


def test_no_module_imports_another_that_imports_it_back() -> None:
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles between modules:\n" + "\n".join(
        "  " + "; ".join(_edges_within(graph, c)) for c in cycles
    )


def test_packages_are_compared_side_by_side() -> None:
    graph = {
        "a.b.x": {"a.c.y", "a.z", "a.b.w"},
        "a.b": {"a.b.x"},
        "a.z": set(),
        "a.run": {"a.b"},
    }
    assert package_graph(graph) == {"a.b": {"a.c", "a.z"}, "a.b.x": {"a.b.w"}, "a.run": {"a.b"}}
    assert strongly_connected(package_graph({"a.b.x": {"a.c.y"}, "a.c.y": {"a.b.q"}})) == [["a.b", "a.c"]]


def test_no_package_imports_another_that_imports_it_back() -> None:
    graph = package_graph(import_graph())
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles between packages:\n" + "\n".join(
        "  " + "; ".join(_edges_within(graph, c)) for c in cycles
    )


def test_gateway_analytics_and_evals_never_import_each_other_and_contracts_imports_none() -> None:
    graph = import_graph()
    apart = {"gateway", "analytics", "evals"}
    crossing = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if (a := m.split(".")[0]) != (b := t.split(".")[0])
        and ((a in apart and b in apart) or (a == "contracts" and b != "contracts"))
    )
    assert not crossing, "imports across the architecture's boundaries:\n" + "\n".join(crossing)


def test_serving_imports_nothing_of_the_project() -> None:
    """serving/ is the HTTP layer under both services: stdlib and third-party libraries only
    (any top-level package or module of the repository counts, listed in PACKAGES or not)."""
    project = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {
        p.stem for p in ROOT.glob("*.py")
    }
    project.discard("serving")
    crossing = []
    for path in sorted((ROOT / "serving").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            crossing += [f"{module_name(path)} -> {n}" for n in names if n.split(".")[0] in project]
    assert not crossing, "serving imports the project:\n" + "\n".join(crossing)


def test_the_serving_check_sees_every_package_of_the_repository() -> None:
    project = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert {"gateway", "analytics", "control", "eventbus", "contracts", "serving"} <= project


# Third-party libraries imported once before forking, so each child pays only for the
# project's own modules (the order in which the project's modules import is what is tested).
_PRELOAD = """
import importlib
for lib in (
    "aiohttp", "alembic.command", "fastapi", "httptools", "jsonschema", "kafka", "msgspec", "numpy",
    "orjson", "prometheus_client.multiprocess", "psycopg", "pydantic", "pydantic_settings", "rich",
    "scipy.stats", "sqlalchemy.dialects.postgresql", "sqlalchemy.orm", "starlette", "typer",
    "uvicorn.config", "yaml",
):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass  # then the child imports it itself
"""
_CHILD = """
import importlib, os, sys, traceback
failed, running = [], {}
def reap():
    pid, status = os.wait()
    if status != 0:
        failed.append(running[pid])
    del running[pid]
for name in sys.argv[1:]:
    if len(running) >= max(1, os.cpu_count() or 1):  # one child per core: independent imports
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    reap()
print("FAILED:" + ",".join(sorted(failed)))
"""


@pytest.mark.services  # a process per module: CI, not the fast loop
def test_every_module_imports_in_an_interpreter_where_nothing_of_the_project_was_imported_first() -> None:
    names = [m for m in product_modules() if m not in SANDBOX_SCRIPTS]
    proc = subprocess.run(
        [sys.executable, "-c", _PRELOAD + _CHILD, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    failed = proc.stdout.strip().rpartition("FAILED:")[2]
    assert not failed, f"modules that do not import on their own: {failed}\n{proc.stderr[-6000:]}"
