"""The embedded PostgreSQL's settings: memory sized from the machine or given (pure logic); the locale (a real initdb)."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftgate.embedded_pg import (
    MAX_SHARED_BUFFERS_MB,
    MIN_SHARED_BUFFERS_MB,
    EmbeddedPostgres,
    auto_shared_buffers,
    from_env,
    memory_bytes,
)

GiB = 1024**3


@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (None, f"{MIN_SHARED_BUFFERS_MB}MB"),  # memory unknown: the floor
        (256 * 1024**2, f"{MIN_SHARED_BUFFERS_MB}MB"),  # a quarter is below the floor
        (4 * GiB, "1024MB"),  # a quarter
        (6 * GiB + 3, "1536MB"),  # whole megabytes, rounded down
        (24 * GiB, f"{MAX_SHARED_BUFFERS_MB}MB"),  # a quarter is above the ceiling
    ],
)
def test_shared_buffers_is_a_quarter_of_the_memory_within_its_bounds(
    total: int | None, expected: str
) -> None:
    assert auto_shared_buffers(total) == expected


def test_the_memory_of_this_machine_is_known_and_positive() -> None:
    total = memory_bytes()
    assert total is not None and total > 0


@pytest.mark.parametrize("value", ["512MB", "2GB", "131072kB"])
def test_a_given_size_is_kept(tmp_path: Path, value: str) -> None:
    assert EmbeddedPostgres(data_dir=tmp_path, shared_buffers=value).shared_buffers == value


@pytest.mark.parametrize("value", ["512", "2 GB", "0MB", "-1GB", "1TB", "512mb", "1GB; fsync=off"])
def test_a_malformed_size_is_refused_with_the_syntax_it_wants(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match="kB, MB or GB"):
        EmbeddedPostgres(data_dir=tmp_path, shared_buffers=value)


def test_the_environment_sets_the_size_and_an_empty_value_means_automatic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIFTGATE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("LIFTGATE_PG_SHARED_BUFFERS", "768MB")
    assert from_env().shared_buffers == "768MB"
    monkeypatch.setenv("LIFTGATE_PG_SHARED_BUFFERS", "")
    assert from_env().shared_buffers is None
    monkeypatch.setenv("LIFTGATE_PG_SHARED_BUFFERS", "lots")
    with pytest.raises(ValueError):
        from_env()


def test_a_new_cluster_compares_text_by_code_point_with_unicode_case_rules(tmp_path: Path) -> None:
    """initdb's locale is ours, not the environment's: the builtin C.UTF-8 collation (memcmp,
    abbreviated keys) in every database made from the template, Unicode-aware ILIKE/upper."""
    import socket

    import psycopg

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pg = EmbeddedPostgres(data_dir=tmp_path / "pg", port=port, durable=False)
    pg.start()
    try:
        url = pg.ensure_database("lg_locale").replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(url) as c:
            provider, locale = c.execute(
                "SELECT datlocprovider, datlocale FROM pg_database WHERE datname = current_database()"
            ).fetchone()  # type: ignore[misc]
            assert (provider, locale) == ("b", "C.UTF-8")
            ordered = [
                r[0] for r in c.execute("SELECT x FROM unnest(ARRAY['b', 'B', 'a', 'é', 'A']) x ORDER BY x")
            ]
            assert ordered == ["A", "B", "a", "b", "é"]  # code point order
            assert c.execute("SELECT 'ÉTÉ' ILIKE '%été%', upper('été')").fetchone() == (True, "ÉTÉ")
    finally:
        pg.stop()


def test_a_durable_start_that_finds_a_server_without_fsync_running_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``liftgate up`` (durable) on a port where a test session's server (fsync off) still runs
    keeps it, and warns that a crash can lose data; a durable server found running: no warning.
    (Only this module's records count: a Kafka client of an earlier test in this worker may
    still log from its thread.)"""
    import logging
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fast = EmbeddedPostgres(data_dir=tmp_path / "pg", port=port, durable=False)
    durable = EmbeddedPostgres(data_dir=tmp_path / "pg", port=port, durable=True)
    fast.start()
    try:
        assert fast.setting("fsync") == "off"
        with caplog.at_level(logging.WARNING, logger="liftgate.embedded_pg"):
            durable.start()
        assert [r.getMessage() for r in caplog.records if r.name == "liftgate.embedded_pg"] == [
            f"the PostgreSQL already running on port {port} has fsync off (started for tests): a crash of"
            " this machine can lose committed data. For a durable server, stop it (`scripts/pg down`) and"
            " start again"
        ]
        fast.stop()
        caplog.clear()
        durable.start()
        assert durable.setting("fsync") == "on"
        with caplog.at_level(logging.WARNING, logger="liftgate.embedded_pg"):
            durable.start()
        assert [r for r in caplog.records if r.name == "liftgate.embedded_pg"] == []
    finally:
        durable.stop()
