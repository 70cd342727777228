"""The commands that read the database directly, with no database to reach: one clear line
and a hint, not a page of traceback (and never the URL's password)."""

from __future__ import annotations

import pytest

from tests.liftgate.frontdoor import free_port, liftgate


@pytest.mark.parametrize(
    "args",
    [
        ("eval", "show", "demo"),
        ("eval", "run", "math", "--experiment", "demo", "--no-progress"),
        ("datasets", "list"),
    ],
    ids=["eval-show", "eval-run", "datasets-list"],
)
def test_an_unreachable_database_is_one_error_with_a_hint(args: tuple[str, ...]) -> None:
    url = f"postgresql+psycopg://liftgate:s3cret-pw@127.0.0.1:{free_port()}/liftgate"  # nothing listens
    proc = liftgate(*args, "--database-url", url, token=None, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr) < 1000, proc.stderr
    assert "error: cannot reach the database" in proc.stderr
    assert "Connection refused" in proc.stderr  # the driver's own reason
    assert "liftgate up" in proc.stderr and "LIFTGATE_DATABASE_URL" in proc.stderr  # what to do
    assert "s3cret-pw" not in proc.stderr + proc.stdout


def test_a_database_without_liftgate_tables_says_to_migrate(pg_admin_url: str) -> None:
    unmigrated = pg_admin_url.replace("postgresql://", "postgresql+psycopg://", 1)  # the maintenance db
    proc = liftgate("datasets", "list", "--database-url", unmigrated, token=None, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr) < 1000, proc.stderr
    assert "error: the database has no liftgate tables" in proc.stderr
    assert "does not exist" in proc.stderr and "liftgate migrate" in proc.stderr
