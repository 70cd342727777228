from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect

import curation.tables  # noqa: F401  (its tables share the metadata)
from contracts.tables import metadata
from liftgate import db as dbmod


@pytest.fixture
def scratch_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of this test's own, dropped afterwards."""
    name = f"lg_scratch_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    yield f"{base}/{name}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_models_and_migrations_do_not_drift(engine: Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, metadata)
    assert diff == [], f"models and migrations differ; add an Alembic revision: {diff}"


def test_upgrade_then_downgrade_to_base_then_upgrade_again(scratch_url: str) -> None:
    dbmod.upgrade(scratch_url)
    eng = create_engine(scratch_url)
    try:
        assert set(metadata.tables) <= set(inspect(eng).get_table_names())
        dbmod.downgrade(scratch_url, "base")
        assert set(inspect(eng).get_table_names()) <= {"alembic_version"}
        dbmod.upgrade(scratch_url)
        assert set(metadata.tables) <= set(inspect(eng).get_table_names())
    finally:
        eng.dispose()
