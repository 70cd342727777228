"""Session-wide real services: PostgreSQL (embedded) and Apache Kafka (scripts/kafka).

Both are started once per test session, or attached to when the environment names them
(``LIFTGATE_TEST_PG_ADMIN_URL``, ``LIFTGATE_KAFKA_BOOTSTRAP``) — `scripts/test` starts
them before pytest. A server a session started itself (the first test that needs it, on
the default ports and state directory) is stopped when the last session using it ends: left
running, a PostgreSQL without fsync (``durable=False``) would be what the next ``make demo``
found on its port and kept its data in. Each session gets its own freshly migrated database, so concurrent
runs never see each other's rows; each test gets a transaction that is rolled back.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from eventbus import Bus, ClientChoice, open_bus
from liftgate import db as dbmod
from liftgate.embedded_pg import EmbeddedPostgres, default_state_dir
from tests.secret_scan import (  # noqa: F401  (the secret scan's hooks and fixture, by their names)
    _secret_scan_log_root,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_testnodedown,
)

ROOT = Path(__file__).resolve().parent.parent
TEST_DB_PREFIX = "lg_test_"


#: Names this test session in every process of it (pytest-xdist's workers inherit it).
_SESSION_ENV = "LIFTGATE_TEST_SESSION"


def _started_marker(service: str) -> Path:
    """Exists while a server ``service`` ("pg", "kafka") that a test session started runs; its
    lines: the sessions using it (``pid-token``), so the last one to end stops it."""
    return default_state_dir() / f"started-by-tests-{service}"


@contextlib.contextmanager
def markers_locked() -> Iterator[None]:
    """Serialises test sessions sharing a state directory while they check whether a server
    runs, start it, and read or rewrite its marker: without it a session could find a server
    another had just started, before that one wrote its marker, not attach, and lose the
    server when the other stopped it."""
    path = default_state_dir() / "started-by-tests.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sessions(marker: Path) -> set[str]:
    """The live sessions a marker names (a killed session's pid is gone: not counted)."""
    with contextlib.suppress(OSError):
        return {line for line in marker.read_text().split() if _live(line.split("-")[0])}
    return set()


def _live(pid: str) -> bool:
    return pid.isdigit() and psutil.pid_exists(int(pid))


def _write_sessions(marker: Path, sessions: set[str]) -> None:
    marker.write_text("\n".join(sorted(sessions - {""})))


def _attach(service: str, started: bool) -> None:
    """This session uses ``service``: it started it, or it joins the sessions of one that did
    (a server someone else started — ``scripts/pg up``, ``liftgate up`` — is left to them)."""
    marker = _started_marker(service)
    if not started and not marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    sessions = (set() if started else _sessions(marker)) | {os.environ.get(_SESSION_ENV, "")}
    _write_sessions(marker, sessions)


def _test_pg() -> EmbeddedPostgres:
    return EmbeddedPostgres(
        data_dir=default_state_dir() / "pg",
        port=int(os.environ.get("LIFTGATE_PG_PORT", "15432")),
        durable=False,
    )


def _kafka_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kafka.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _admin_url() -> str:
    url = os.environ.get("LIFTGATE_TEST_PG_ADMIN_URL")
    if url:
        return url
    pg = _test_pg()
    with markers_locked():
        started = not (pg.initialized() and pg.running())
        pg.start()
        _attach("pg", started)
    return f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        os.environ[_SESSION_ENV] = f"{os.getpid()}-{secrets.token_hex(4)}"


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The last session using a server a test session started stops it (after every worker
    of this one is gone)."""
    session = os.environ.get(_SESSION_ENV)
    if hasattr(config, "workerinput") or not session:
        return
    for service in ("pg", "kafka"):
        with markers_locked():
            marker = _started_marker(service)
            sessions = _sessions(marker)
            if session not in sessions:
                continue
            if sessions - {session}:  # another run still uses it
                _write_sessions(marker, sessions - {session})
                continue
            if service == "pg":
                _test_pg().stop()
            else:
                _kafka_script("down")
            marker.unlink(missing_ok=True)


def _drop_stale_databases(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Drop databases left by killed test sessions (their creator pid is gone)."""
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s", (TEST_DB_PREFIX + "%",)
    ).fetchall()
    for (name,) in rows:
        parts = str(name).split("_")
        pid = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else -1
        if pid > 0 and psutil.pid_exists(pid):
            continue
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    return _admin_url()


@contextlib.contextmanager
def fresh_database(pg_admin_url: str) -> Iterator[str]:
    """A new, migrated database (SQLAlchemy URL, psycopg 3 driver), dropped afterwards.

    Its name carries this process's pid, so one left by a killed run is dropped by the next.
    """
    name = f"{TEST_DB_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        _drop_stale_databases(conn)
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    url = f"{base}/{name}"
    try:
        dbmod.upgrade(url)
        yield url
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """A new, migrated database for this test session (SQLAlchemy URL, psycopg 3 driver)."""
    with fresh_database(pg_admin_url) as url:
        yield url


@pytest.fixture(scope="module")
def module_database_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this test module's own: for services that act on every
    experiment they find (snapshotter, rollout controller), so other tests' rows can't
    slow them down or change what they do."""
    with fresh_database(pg_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=5, max_overflow=20)
    yield eng
    eng.dispose()


@pytest.fixture
def db(engine: Engine) -> Iterator[Session]:
    """A session whose work is rolled back after the test (commits become savepoints)."""
    conn = engine.connect()
    trans = conn.begin()
    session = Session(bind=conn, join_transaction_mode="create_savepoint")
    try:
        yield session
    finally:
        session.close()
        trans.rollback()
        conn.close()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """A real Apache Kafka broker: attached via LIFTGATE_KAFKA_BOOTSTRAP or started by scripts/kafka."""
    bootstrap = os.environ.get("LIFTGATE_KAFKA_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    port = os.environ.get("LIFTGATE_KAFKA_PORT", "19092")
    with markers_locked():
        started = _kafka_script("status").returncode != 0
        res = _kafka_script("up", "--port", port)
        if res.returncode != 0:
            raise RuntimeError(f"could not start Kafka: {res.stdout}\n{res.stderr}")
        _attach("kafka", started)
    return f"127.0.0.1:{port}"


KAFKA_CLIENTS = ("confluent", "python")


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka_client(request: pytest.FixtureRequest) -> ClientChoice:
    """Each Kafka client backend in turn: the bus contract holds for both."""
    choice: ClientChoice = request.param
    return choice


@pytest.fixture
def bus(kafka_client: ClientChoice) -> Bus:
    return open_bus(kafka_client)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A name no other test (or concurrent test session) uses: for topics, groups, experiments."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"{base}-{secrets.token_hex(4)}"


# What `make check` leaves out. A test is marked ``services`` when it reaches PostgreSQL, Kafka
# or a started process through a fixture (directly or through another fixture), or lives in a
# folder whose tests start servers themselves; the rest is pure logic and runs in seconds.
SERVICE_FIXTURES = frozenset(
    {
        "pg_admin_url",
        "database_url",
        "module_database_url",
        "engine",
        "db",
        "kafka_bootstrap",
        "simulator",
        "simulator_url",
        "analytics_url",
        "browser",
        "stack",
    }
)
SERVICE_FOLDERS = ("scenarios", "dashboards", "gateway", "liftgate", "scripts")
# Modules whose tests start processes without a fixture (sandboxed scorers, the CLI, a fresh
# interpreter per module).
SERVICE_MODULES = frozenset(
    {
        "evals/test_builtin_suites.py",
        "evals/test_cli_score.py",
        "evals/test_demo_gate.py",
        "evals/test_gate_end_to_end.py",
        "evals/test_runner.py",
        "evals/test_sandbox_attacks.py",
        "evals/test_sandbox_confine.py",
        "contracts/test_redaction.py",
        "test_logs_hold_no_secrets.py",
    }
)


def _schedule(items: list[pytest.Item]) -> None:
    """Order the files for ``scripts/test`` (xdist ``--dist loadfile --no-loadscope-reorder``
    hands files to the workers in this order): the fuzz files, then the other files marked
    ``long``, then the rest with the most tests first (xdist's own order). Longest first, so
    the run ends on short files on both workers instead of one worker finishing a
    several-minute file alone; within a rank, files keep their collection order."""
    per_file: dict[Path, list[pytest.Item]] = {}
    for item in items:
        per_file.setdefault(Path(str(item.path)), []).append(item)

    def rank(tests: list[pytest.Item]) -> tuple[int, int]:
        if any(t.get_closest_marker("fuzz") for t in tests):
            return (0, 0)
        if any(t.get_closest_marker("long") for t in tests):
            return (1, 0)
        return (2, -len(tests))

    items[:] = [t for _, tests in sorted(per_file.items(), key=lambda kv: rank(kv[1])) for t in tests]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _schedule(items)
    tests_root = Path(__file__).resolve().parent
    for item in items:
        where = Path(str(item.path)).resolve().relative_to(tests_root)
        if (
            where.parts[0] in SERVICE_FOLDERS
            or where.as_posix() in SERVICE_MODULES
            or SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.services)
