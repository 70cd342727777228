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


def test_the_conversations_migration_fills_the_counted_table_from_the_stored_turns(scratch_url: str) -> None:
    """0016: the conversations ingest counted before (a counted turn stored: primary, in an
    experiment arm) are in conversations_counted, once; the others are not; the probe's index
    is gone, and back after a downgrade."""
    dbmod.upgrade(scratch_url, "0015")
    url = scratch_url.replace("postgresql+psycopg://", "postgresql://", 1)
    rows = [  # (experiment, variant, role, conversation)
        (1, "control", "primary", "c1"),
        (1, "control", "primary", "c1"),  # a second turn
        (1, "candidate", "primary", "c2"),
        (2, "control", "primary", "c1"),  # the same id in another experiment
        (1, "control", "shadow", "c3"),  # not counted: a shadow call
        (None, None, "primary", "c4"),  # not counted: outside experiments
        (1, "control", "primary", None),  # no conversation
    ]
    with psycopg.connect(url) as conn:
        for k, (exp, variant, role, conv) in enumerate(rows):
            conn.execute(
                "INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id,"
                " unit_source, role, mode, endpoint, model, upstream, status, http_status, latency_ms,"
                " response_chars, stream, fallback, tags, conversation_id)"
                " VALUES (gen_random_uuid(), now(), %s, 'r', %s, %s, 'u', 'header', %s, 'ab', 'chat', 'm', 'up',"
                " 'ok', 200, 1, 1, false, false, '{}', %s)",
                (f"req-{k}", exp, variant, role, conv),
            )
    dbmod.upgrade(scratch_url)
    eng = create_engine(scratch_url)
    try:
        with psycopg.connect(url) as conn:
            got = conn.execute("SELECT * FROM conversations_counted ORDER BY 1, 2").fetchall()
        assert got == [(1, "c1"), (1, "c2"), (2, "c1")]
        assert "ix_interactions_conversation_id" not in {
            i["name"] for i in inspect(eng).get_indexes("interactions")
        }
        dbmod.downgrade(scratch_url, "0015")
        assert "ix_interactions_conversation_id" in {
            i["name"] for i in inspect(eng).get_indexes("interactions")
        }
        assert "conversations_counted" not in inspect(eng).get_table_names()
    finally:
        eng.dispose()


# A row of rl_rollups as revisions 0014–0017 define it (0018's ``compacted`` takes its default).
_RL_INSERT = (
    "INSERT INTO rl_rollups (experiment_id, variant, unit_id, category, lbin, responses, tokens,"
    " thumbs_up, thumbs_down) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def test_the_append_migration_keeps_rl_rollups_and_its_downgrade_sums_them_per_key(scratch_url: str) -> None:
    """0017: rl_rollups loses its primary key (ingest appends a row per counted response and
    thumb) and keeps the stored rows; the downgrade sums the rows of each key into one and
    puts the key back."""
    dbmod.upgrade(scratch_url, "0016")
    url = scratch_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url) as conn:
        conn.execute(_RL_INSERT, (1, "control", "u1", "math", 3, 2, 10, 1, 0))
        conn.execute(_RL_INSERT, (1, "candidate", "u2", "code", 5, 1, 30, 0, 1))
    dbmod.upgrade(scratch_url)
    eng = create_engine(scratch_url)
    try:
        assert inspect(eng).get_pk_constraint("rl_rollups")["constrained_columns"] == []
        assert "ix_rl_rollups_experiment_id" in {i["name"] for i in inspect(eng).get_indexes("rl_rollups")}
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM rl_rollups").fetchone() == (2,)
            conn.execute(_RL_INSERT, (1, "control", "u1", "math", 3, 1, 4, 0, 0))  # the same key again
            conn.execute(_RL_INSERT, (1, "control", "u1", "math", 3, 0, 0, 0, 1))  # a thumb of it
        dbmod.downgrade(scratch_url, "0016")
        assert inspect(eng).get_pk_constraint("rl_rollups")["constrained_columns"] == [
            "experiment_id", "variant", "unit_id", "category", "lbin",
        ]  # fmt: skip
        with psycopg.connect(url) as conn:
            got = conn.execute("SELECT * FROM rl_rollups ORDER BY variant").fetchall()
        assert got == [
            (1, "candidate", "u2", "code", 5, 1.0, 30.0, 0.0, 1.0),
            (1, "control", "u1", "math", 3, 3.0, 14.0, 1.0, 1.0),
        ]
    finally:
        eng.dispose()


def test_the_compaction_migration_keeps_every_rl_rollups_row_both_ways(scratch_url: str) -> None:
    """0018: rl_rollups gets ``compacted`` (stored rows: appended, not compacted) and a unique
    index over the key of the compacted rows only; the downgrade keeps every row."""
    dbmod.upgrade(scratch_url, "0017")
    url = scratch_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url) as conn:
        conn.execute(_RL_INSERT, (1, "control", "u1", "math", 3, 2, 10, 1, 0))
        conn.execute(_RL_INSERT, (1, "control", "u1", "math", 3, 0, 0, 0, 1))  # the same key twice
    dbmod.upgrade(scratch_url)
    eng = create_engine(scratch_url)
    try:
        indexes = {i["name"]: i for i in inspect(eng).get_indexes("rl_rollups")}
        assert indexes["ix_rl_rollups_experiment_id"]["column_names"] == ["experiment_id", "compacted"]
        assert indexes["uq_rl_rollups_compacted"]["unique"]
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM rl_rollups WHERE NOT compacted").fetchone() == (2,)
            compacted = _RL_INSERT.replace("thumbs_down)", "thumbs_down, compacted)").replace(
                "%s)", "%s, true)"
            )
            conn.execute(compacted, (1, "control", "u1", "math", 3, 1, 1, 0, 0))
            with pytest.raises(psycopg.errors.UniqueViolation):  # one compacted row per key
                conn.execute(compacted, (1, "control", "u1", "math", 3, 1, 1, 0, 0))
            conn.rollback()
            conn.execute(compacted, (1, "control", "u1", "math", 3, 1, 1, 0, 0))
        dbmod.downgrade(scratch_url, "0017")
        assert "compacted" not in {c["name"] for c in inspect(eng).get_columns("rl_rollups")}
        with psycopg.connect(url) as conn:
            got = conn.execute(
                "SELECT count(*), sum(responses), sum(tokens), sum(thumbs_up), sum(thumbs_down) FROM rl_rollups"
            ).fetchone()
        assert got == (3, 3.0, 11.0, 1.0, 1.0)
    finally:
        eng.dispose()
