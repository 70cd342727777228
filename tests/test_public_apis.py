"""Kafka clients are used through their public APIs only (no private attributes or modules).

A private attribute (``producer._accumulator``) or an internal module (``kafka.record``,
``kafka.consumer.fetcher``) may change in any patch release of the client; the pinned
ranges in pyproject.toml are only safe while nothing depends on them.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("analytics", "bench", "contracts", "eventbus", "gateway", "liftgate", "scripts", "tests")
# Modules the clients document for applications; anything else of theirs is internal.
PUBLIC_MODULES = {"kafka", "kafka.admin", "kafka.errors", "confluent_kafka", "confluent_kafka.admin"}
CLIENT_ROOTS = ("kafka", "confluent_kafka")


def _python_files() -> list[Path]:
    return [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py")) if ".venv" not in p.parts]


def _client_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [m for m in found if m.split(".")[0] in CLIENT_ROOTS]


@functools.cache
def _own_private_names() -> set[str]:
    """Private names liftgate itself defines (``self._x = ...``, ``def _x``, ``_x: int`` in a class)."""
    names = set()
    for p in _python_files():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {n for n in names if n.startswith("_")}


def _private_accesses(tree: ast.AST, own: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """``x._name`` on anything but ``self``/``cls`` (unless liftgate defines ``_name``), ``getattr(x, "_name")``.

    librdkafka's local error codes are spelt ``KafkaError._TRANSPORT`` etc. in confluent-kafka's
    documentation: upper-case names on ``KafkaError`` are public.
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if (isinstance(base, ast.Name) and base.id in ("self", "cls")) or node.attr in own:
                continue
            error_code = node.attr.isupper() and (
                (isinstance(base, ast.Attribute) and base.attr == "KafkaError")
                or (isinstance(base, ast.Name) and base.id == "KafkaError")
            )
            if not error_code:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
        ):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


@pytest.mark.slow
def test_only_public_modules_of_the_kafka_clients_are_imported() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(set(mods) - PUBLIC_MODULES)
        for p in _python_files()
        if (mods := _client_imports(ast.parse(p.read_text(), str(p))))
    }
    assert {f: m for f, m in bad.items() if m} == {}


@pytest.mark.slow
def test_no_private_attribute_is_used_in_a_module_that_imports_a_kafka_client() -> None:
    bad = {}
    own = _own_private_names()
    for p in _python_files():
        tree = ast.parse(p.read_text(), str(p))
        if _client_imports(tree) and (found := _private_accesses(tree, own)):
            bad[str(p.relative_to(ROOT))] = found
    assert bad == {}


def test_no_source_names_a_client_internal() -> None:
    # Also C sources and strings (e.g. a module patched through importlib by name).
    pattern = re.compile(
        r"_accumulator|kafka\.(record|protocol|consumer\.fetcher|producer\.record_accumulator)\b"
    )
    me = Path(__file__).resolve()
    bad = [
        str(p.relative_to(ROOT))
        for d in SOURCES
        for p in sorted((ROOT / d).rglob("*"))
        if p.suffix in (".py", ".c", ".pyi") and p.resolve() != me and pattern.search(p.read_text())
    ]
    assert bad == []


@pytest.mark.slow
def test_the_checks_catch_a_private_use() -> None:
    # The checks themselves can fail: a patch like the one they exist to prevent is caught.
    tree = ast.parse(
        "from kafka.record.default_records import DefaultRecordBatch\n"
        "def f(p):\n    return p._accumulator.append, getattr(p, '_sender')\n"
    )
    assert _client_imports(tree) == ["kafka.record.default_records"]
    assert len(_private_accesses(tree, _own_private_names())) == 2
