"""The control plane is the only writer of its tables: a source scan that fails on a second one.

Every product module outside ``control/`` (migrations, tests and benchmarks seed data and stand aside) is parsed; a write to a
control table — SQL text (``INSERT INTO experiments``, ``UPDATE variants``, ``DELETE FROM
audit_log``…), SQLAlchemy Core (``insert(Experiment)``, ``update(Variant)``,
``Experiment.__table__.delete()``) or the ORM (``db.add(Experiment(...))``, ``session.delete``
/ ``merge`` / ``add`` in a module that imports a control table's class) — is a failure
naming the file and line. The scanner itself is checked against known writes first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Final

import pytest

from contracts.tables import (
    ApiKey,
    AuditLog,
    Experiment,
    GateDecision,
    MetricDefinition,
    NotificationEvent,
    OfflineGateDeclaration,
    RolloutDecision,
    SignInFailure,
    Upstream,
    UsedSignInLink,
    User,
    UserSession,
    UserToken,
    Variant,
    Webhook,
    WebhookDelivery,
)

ROOT: Final = Path(__file__).resolve().parents[2]
CLASSES: Final = {
    c.__name__: str(c.__tablename__)
    for c in (
        Experiment,
        Variant,
        Upstream,
        ApiKey,
        MetricDefinition,
        RolloutDecision,
        OfflineGateDeclaration,
        GateDecision,
        AuditLog,
        User,
        UserToken,
        UserSession,
        SignInFailure,
        UsedSignInLink,
        Webhook,
        NotificationEvent,
        WebhookDelivery,
    )
}
TABLES: Final = sorted(CLASSES.values())
_T: Final = r"(?:only\s+)?(?:public\.)?\"?(" + "|".join(TABLES) + r")\b\"?"
_SQL_WRITE: Final = re.compile(
    rf"(?is)\binsert\s+into\s+{_T}|\bdelete\s+from\s+{_T}|\bupdate\s+{_T}(?:\s+(?:as\s+)?\w+)?\s+set\b"
)
_CORE: Final = frozenset({"insert", "update", "delete"})
_ORM: Final = frozenset({"add", "add_all", "delete", "merge", "bulk_save_objects", "bulk_insert_mappings"})
# Product code. Not migrations, tests or bench/: those build schemas and seed synthetic
# databases directly, as fixtures.
SCANNED: Final = ("gateway", "analytics", "evals", "liftgate", "contracts", "scripts", "examples")


def _strings(node: ast.AST) -> list[str]:
    """Every string literal, f-strings joined with a placeholder for their holes."""
    out = []
    for child in ast.walk(node):
        if isinstance(child, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in child.values))  # type: ignore[misc]
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            out.append(child.value)
    return out


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def writes(source: str) -> list[tuple[int, str]]:
    """(line, what) for each write to a control table in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in CLASSES
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr):
            for text in _strings(node):
                match = _SQL_WRITE.search(text)
                if match:
                    table = next(g for g in match.groups() if g)
                    found.append((node.lineno, f"SQL write to {table}"))
        if not isinstance(node, ast.Call):
            continue
        fn = _name(node.func)
        target = _name(node.args[0]) if node.args else None
        if fn in _CORE and target in CLASSES:
            found.append((node.lineno, f"{fn}({target})"))
        if (
            fn in _CORE
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "__table__"
            and _name(node.func.value.value) in CLASSES
        ):
            found.append((node.lineno, f"{_name(node.func.value.value)}.__table__.{fn}()"))
        if fn in _ORM and isinstance(node.func, ast.Attribute):
            made = node.args[0] if node.args else None
            if isinstance(made, ast.Call) and _name(made.func) in CLASSES:
                found.append((node.lineno, f".{fn}({_name(made.func)}(...))"))
            elif imported:
                found.append((node.lineno, f"ORM .{fn}() in a module importing {sorted(imported)}"))
    return sorted(set(found))


def _modules() -> list[Path]:
    out = []
    for top in SCANNED:
        base = ROOT / top
        if base.is_dir():
            out.extend(p for p in sorted(base.rglob("*.py")) if ".venv" not in p.parts)
    return out


@pytest.mark.parametrize(
    "source",
    [
        'conn.execute(text("INSERT INTO experiments (name) VALUES (:n)"))',
        'conn.execute(text("UPDATE variants SET weight = 1 WHERE id = :id"))',
        'conn.execute(text(f"DELETE FROM audit_log WHERE id = {x}"))',
        'sql = """\n  update   rollout_decisions set reason = 1"""',
        "from contracts.tables import Experiment\nconn.execute(insert(Experiment).values(name='x'))",
        "from contracts.tables import Upstream\nconn.execute(sa.update(Upstream).values(name='x'))",
        "from contracts.tables import GateDecision\nconn.execute(GateDecision.__table__.delete())",
        "from contracts.tables import ApiKey\ndb.add(ApiKey(name='k'))",
        "from contracts.tables import Variant\ndb.delete(v)",
        "db.add(MetricDefinition(name='m'))",
    ],
)
def test_the_scanner_finds_each_kind_of_write(source: str) -> None:
    assert writes(source), source


@pytest.mark.parametrize(
    "source",
    [
        'conn.execute(text("SELECT id FROM experiments WHERE name = :n FOR UPDATE"))',
        'conn.execute(text("UPDATE unit_rollups SET n = 1"))',
        "conn.execute(select(Experiment.id))",
        "from contracts.tables import EvalRun\nconn.execute(update(EvalRun).values(status='x'))",
        "items.add(value)",
        'log.info("update experiments through the admin API")',
    ],
)
def test_the_scanner_passes_reads_and_other_tables(source: str) -> None:
    assert not writes(source), source


def test_no_module_outside_control_writes_a_control_table() -> None:
    modules = _modules()
    assert len(modules) > 100  # the scan saw the code base, not an empty directory
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in modules
        for line, what in writes(path.read_text())
    ]
    assert offenders == [], "control tables are written only through control/:\n" + "\n".join(offenders)


def test_control_imports_only_contracts_among_the_project_packages() -> None:
    own = {"gateway", "analytics", "evals", "liftgate", "contracts", "control", "migrations"}
    for path in sorted((ROOT / "control").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in own - {"contracts", "control"}, f"{path.relative_to(ROOT)} imports {name}"


def re_exports(source: str) -> list[str]:
    """Names a module imports from ``control`` and lists in its ``__all__`` (a re-export shim)."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "control"
        for alias in node.names
    }
    exported: set[str] = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            exported |= {
                e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return sorted(imported & exported)


def test_the_shim_scanner_finds_a_re_export_and_passes_a_plain_import() -> None:
    assert re_exports("from control.rollout import load, promote\n__all__ = ['load', 'stage_split']") == [
        "load"
    ]
    assert re_exports("from control import rollout\n__all__ = ['view']") == []


def test_no_module_outside_control_re_exports_the_control_plane() -> None:
    # Callers import control.* themselves: a second name for a writer (a shim such as the
    # former analytics.rollout.store) hides where a write goes.
    offenders = {
        str(path.relative_to(ROOT)): names for path in _modules() if (names := re_exports(path.read_text()))
    }
    assert offenders == {}


_STATUS_SQL: Final = re.compile(r"(?is)\bupdate\s+experiments\b[^;]*?\bset\b[^;]*?\bstatus\s*=")


def status_writes(source: str) -> list[tuple[int, str]]:
    """(line, what) for each write of an experiment's status in ``source``: SQL text setting
    ``status`` on ``experiments``, or an ORM assignment ``x.status = …`` (not ``self.status``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant | ast.JoinedStr) and any(
            _STATUS_SQL.search(t) for t in _strings(node)
        ):
            found.append((node.lineno, "SQL"))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "status" and _name(t.value) != "self":
                    found.append((node.lineno, f"{_name(t.value)}.status ="))
    return sorted(set(found))


def test_the_status_scanner_finds_sql_and_orm_writes_and_passes_the_rest() -> None:
    assert status_writes('text(f"UPDATE experiments SET {sets} WHERE id = :e")') == []  # no status in sight
    assert status_writes('text("UPDATE experiments SET status = :st WHERE id = :e")') == [(1, "SQL")]
    assert status_writes('x = """update experiments\n set updated_at = now(), status = \'paused\'"""') == [
        (1, "SQL")
    ]
    assert status_writes("e.status = target") == [(1, "e.status =")]
    assert status_writes("self.status = status") == []
    assert status_writes('text("UPDATE webhook_deliveries SET status = :st")') == []


def test_an_experiments_status_is_written_by_one_function_of_the_control_plane() -> None:
    # Start, pause, stop (operators), rollback and promotion (the controller), manual rollout
    # actions and the offline gate's pause all go through control.rollout.set_status: one
    # statement, one rule for started_at/stopped_at, under the caller's lock and FOR UPDATE.
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted((ROOT / "control").rglob("*.py"))
        for line, what in status_writes(path.read_text())
    ]
    src = (ROOT / "control" / "rollout.py").read_text()
    setter = next(
        n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "set_status"
    )
    assert '"status = :st"' in ast.get_source_segment(src, setter)  # type: ignore[operator]
    assert offenders == [], (
        "an experiment's status is written only by control.rollout.set_status:\n" + "\n".join(offenders)
    )
