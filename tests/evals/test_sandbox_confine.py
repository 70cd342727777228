"""The kernel-level confinement alone (no audit hook): network, filesystem, identity, limits.

A real interpreter confines itself exactly as the sandbox's harness does, then probes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evals.scorers.sandbox import SandboxLimits
from evals.scorers.sandbox.runner import HERE, _config

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import json, os, socket, sys
    sys.path.insert(0, sys.argv[1])
    import confine
    cfg = json.loads(sys.argv[2])
    out = {"isolation": confine.confine(cfg)}
    try:
        s = socket.socket()
        s.settimeout(2)
        s.connect(("127.0.0.1", int(sys.argv[3])))
        s.close()
        out["connect"] = "connected"
    except OSError as exc:
        out["connect"] = f"{type(exc).__name__}: {exc}"
    out["repo_visible"] = os.path.exists(sys.argv[4])
    out["proc_visible"] = os.path.exists("/proc/self")
    out["uid"] = os.getuid()
    out["cwd"] = os.getcwd()
    try:
        open("/escape", "w").close()
        out["root_writable"] = True
    except OSError:
        out["root_writable"] = False
    with open("scratch", "w") as fh:
        fh.write("ok")
    out["tmp_writable"] = True
    try:
        import math, decimal
        out["stdlib_imports"] = True
    except ImportError:
        out["stdlib_imports"] = False
    print(json.dumps(out))
""")


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    hits: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
                hits.append(1)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], hits
    stop.set()
    thread.join(timeout=2)
    server.close()


def _probe(port: int, namespaces: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="liftgate-confine-test-") as root:
        os.chmod(root, 0o777)
        cfg = _config(SandboxLimits(namespaces=namespaces), root)  # type: ignore[arg-type]
        res = subprocess.run(
            [os.path.realpath(sys.executable), "-I", "-S", "-c", PROBE, str(HERE), json.dumps(cfg), str(port),
             str(ROOT / "pyproject.toml")],
            capture_output=True, text=True, timeout=30, env={}, cwd=root, check=False,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_namespaces_cut_the_network_hide_the_filesystem_and_drop_root(
    listener: tuple[int, list[int]],
) -> None:
    port, hits = listener
    out = _probe(port, "require")
    assert out["isolation"] == "namespaces"
    assert "unreachable" in out["connect"].lower()
    assert hits == []
    assert out["repo_visible"] is False
    assert out["proc_visible"] is False
    assert out["root_writable"] is False
    assert out["cwd"] == "/tmp" and out["tmp_writable"] and out["stdlib_imports"]
    if os.geteuid() == 0:
        assert out["uid"] == 65534


def test_without_namespaces_the_same_probe_reaches_the_listener(listener: tuple[int, list[int]]) -> None:
    """The control: the probe itself can connect, so the test above measures the namespace."""
    port, hits = listener
    out = _probe(port, "off")
    assert out["isolation"] == "rlimits"
    assert out["connect"] == "connected"
    assert hits == [1]
