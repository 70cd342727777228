"""Test sessions sharing a server one of them started (tests/conftest.py's markers).

The last session using a server a test session started stops it; a session finding a
server another session started joins that session's marker. Starting and joining are
serialised by ``markers_locked``: a session that finds the server the other one has just
started, before that one wrote its marker, waits for the marker and joins it (without the
lock it joined nothing and lost the server when the other session ended).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent

# A second session: attaches to "pg" as a session that found the server running.
_SECOND = """
import os, sys
from tests import conftest
os.environ[conftest._SESSION_ENV] = sys.argv[1]
with conftest.markers_locked():
    conftest._attach("pg", started=False)
"""


def _waiting_on_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked on a file lock (a ``->`` line of /proc/locks)."""
    return any(" -> " in line and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines())


def test_a_session_finding_a_server_being_started_joins_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIFTGATE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv(conftest._SESSION_ENV, f"{os.getpid()}-first")
    second_session = f"{os.getpid()}-second"  # a live pid: the marker keeps the line
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with conftest.markers_locked():
        # The first session has started the server and not yet written its marker.
        second = subprocess.Popen([sys.executable, "-c", _SECOND, second_session], cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while not _waiting_on_a_lock(second.pid):
            assert second.poll() is None, "the second session did not wait for the first"
            assert time.monotonic() < deadline, "the second session never reached the lock"
            time.sleep(0.01)
        conftest._attach("pg", started=True)
    assert second.wait(timeout=60) == 0
    marker = conftest._started_marker("pg")
    assert set(marker.read_text().split()) == {f"{os.getpid()}-first", second_session}


def test_a_killed_sessions_line_does_not_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_STATE_DIR", str(tmp_path))
    marker = conftest._started_marker("pg")
    marker.parent.mkdir(parents=True, exist_ok=True)
    live, dead = f"{os.getpid()}-a", "999999999-b"  # no such pid: a killed session
    conftest._write_sessions(marker, {live, dead})
    assert conftest._sessions(marker) == {live}
