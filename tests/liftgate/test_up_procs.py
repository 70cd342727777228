"""The process supervision under `liftgate up`: groups, readiness, no orphans; the admin token file."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from liftgate.procs import Child, StartupError, Supervisor
from liftgate.stack import UpstreamSpec, admin_token
from tests.liftgate.frontdoor import free_port

# A child that starts a grandchild (like uvicorn workers) and serves /health on a port.
_SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_supervisor_waits_for_health_and_stops_whole_process_groups(tmp_path: Path) -> None:
    sup = Supervisor()
    ports = [free_port(), free_port()]
    children = [
        Child(
            f"srv{i}",
            [sys.executable, "-c", _SERVER, str(p)],
            dict(os.environ),
            tmp_path / f"srv{i}.log",
            health_url=f"http://127.0.0.1:{p}/health",
        )
        for i, p in enumerate(ports)
    ]
    try:
        for child in children:
            sup.start(child, ready_timeout=20)
        pids: list[int] = []
        for child in children:
            assert child.pid is not None and child.alive()
            assert os.getpgid(child.pid) == child.pid, "each child leads its own process group"
            kids = psutil.Process(child.pid).children(recursive=True)
            assert kids, "the grandchild was started"
            pids += [child.pid, *(k.pid for k in kids)]
        assert sup.first_dead() is None
    finally:
        sup.stop_all()
    assert _gone(pids), "no child or grandchild survives stop_all"


def test_a_child_that_exits_during_startup_is_reported_with_its_log(tmp_path: Path) -> None:
    child = Child("broken", [sys.executable, "-c", "print('boom: bad config'); raise SystemExit(3)"],
                  dict(os.environ), tmp_path / "broken.log", health_url=f"http://127.0.0.1:{free_port()}/h")  # fmt: skip
    with pytest.raises(StartupError, match=r"(?s)broken exited with code 3.*boom: bad config"):
        Supervisor().start(child, ready_timeout=20)


def test_a_child_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    sup = Supervisor()
    child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ),
                  tmp_path / "s.log", health_url=f"http://127.0.0.1:{free_port()}/h")  # fmt: skip
    try:
        with pytest.raises(StartupError, match="not ready"):
            sup.start(child, ready_timeout=1.5)
    finally:
        sup.stop_all()
    assert child.pid is not None and _gone([child.pid])


_STUBBORN = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def test_children_that_ignore_sigterm_are_killed_at_one_shared_deadline(tmp_path: Path) -> None:
    sup = Supervisor()
    children = [
        Child(f"stubborn{i}", [sys.executable, "-c", _STUBBORN], dict(os.environ), tmp_path / f"s{i}.log")
        for i in range(3)
    ]
    try:
        for child in children:
            sup.start(child)
        deadline = time.monotonic() + 30
        while not all("ready" in c.log_tail() for c in children):  # SIGTERM is ignored from here on
            assert time.monotonic() < deadline, [c.log_tail() for c in children]
            time.sleep(0.05)
        t0 = time.monotonic()
        sup.stop_all(timeout=2.0)
        elapsed = time.monotonic() - t0
    finally:
        sup.stop_all()
    assert all(c.proc is not None and c.proc.returncode == -9 for c in children), "killed, not stopped"
    # One deadline for all: one child after another would take 3 x 2 s.
    assert 2.0 <= elapsed < 5.0, elapsed


def test_admin_token_is_generated_once_private_and_reused(tmp_path: Path) -> None:
    first = admin_token(tmp_path)
    path = tmp_path / "admin_token"
    assert len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_token(tmp_path) == first
    assert admin_token(tmp_path / ".." / tmp_path.name) == first


def test_upstream_option_parsing() -> None:
    spec = UpstreamSpec.parse("prod=http://10.0.0.5:8000/v1")
    assert (spec.name, spec.base_url) == ("prod", "http://10.0.0.5:8000/v1")
    for bad in ("prod", "=http://x", "prod=ftp://x"):
        with pytest.raises(ValueError, match="NAME="):
            UpstreamSpec.parse(bad)


def test_up_refuses_busy_ports_naming_each_one_and_its_flag(tmp_path: Path) -> None:
    import socket

    from liftgate.stack import StackOptions, start_stack

    with socket.socket() as busy, socket.socket() as busy_too, socket.socket() as busy_pg:
        for s in (busy, busy_too, busy_pg):
            s.bind(("127.0.0.1", 0))
            s.listen()
        port, port_too, pg = (s.getsockname()[1] for s in (busy, busy_too, busy_pg))
        opts = StackOptions(state_dir=tmp_path, gateway_port=port, analytics_port=free_port(),
                            baseline_port=free_port(), candidate_port=port_too, pg_port=pg)  # fmt: skip
        with pytest.raises(RuntimeError) as info:
            start_stack(opts)
    message = str(info.value)
    assert f"port {port} is in use: choose another with --gateway-port PORT" in message
    assert f"port {port_too} is in use: choose another with --candidate-port PORT" in message
    assert f"port {pg} is in use: choose another with --pg-port PORT" in message
    assert "--analytics-port" not in message and "--baseline-port" not in message
    assert not (tmp_path / "pg").exists(), "nothing was started"


def test_stack_stops_its_postgres_even_when_pg_ctl_cannot_reach_the_data_dir() -> None:
    import shutil
    import tempfile

    from liftgate.embedded_pg import EmbeddedPostgres
    from liftgate.stack import RunningStack, StackOptions, _postmaster_pid

    root = Path(tempfile.mkdtemp(prefix="liftgate-pgstop-"))
    try:
        opts = StackOptions(state_dir=root / "state", pg_port=free_port())
        pg = EmbeddedPostgres(data_dir=opts.state_dir / "pg", port=opts.pg_port, durable=False)
        pg.start()
        pid = _postmaster_pid(pg.data_dir)
        assert pid is not None and psutil.pid_exists(pid)
        stack = RunningStack(
            options=opts, admin_token="x" * 32, database_url="", pg=pg, started_pg=True, pg_pid=pid
        )
        if os.geteuid() == 0:
            # What a concurrent pytest session does to its temp root: the server's user loses access.
            os.chmod(root, 0o700)
        stack.stop()
        assert _gone([pid], timeout=5), "the postmaster outlived `liftgate up`"
    finally:
        os.chmod(root, 0o755)
        shutil.rmtree(root, ignore_errors=True)
