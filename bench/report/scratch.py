"""The report benchmarks' scratch database: created (or kept with ``--reuse``) on the
embedded server and migrated to head; and their progress log on stderr."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import psycopg

from liftgate import db as dbmod


def log(msg: str) -> None:
    sys.stderr.write(f"[{datetime.now(UTC):%H:%M:%S}] {msg}\n")
    sys.stderr.flush()


def scratch_database(admin_url: str, name: str, reuse: bool) -> str:
    """The URL of database ``name``, migrated; dropped and created afresh unless ``reuse``."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists and not reuse:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            exists = None
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{admin_url.rsplit('/', 1)[0]}/{name}"
    dbmod.upgrade(url.replace("postgresql://", "postgresql+psycopg://", 1))
    return url
