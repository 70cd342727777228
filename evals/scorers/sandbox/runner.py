"""Run a Python program's unit tests in the sandbox; the caller's side of it.

The harness (``harness.py``, ``confine.py``, ``worker.py``, ``wire.py`` beside this file;
stdlib only) runs in a new interpreter with an empty environment, in its own session, and
the whole process group is killed when the wall-clock limit passes. A run passes only when
the harness exits 0 and prints exactly one JSON line that carries this run's nonce (32
random bytes it read from its stdin after forking the worker, so the candidate's process
never held it) and one passing result for each test sent, in order, by name.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evals.scorers.sandbox import wire

HERE = Path(__file__).resolve().parent
_BOOT = f"import sys; sys.path.insert(0, {str(HERE)!r}); import harness; harness.main()"
Namespaces = Literal["require", "try", "off"]


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Limits of one sandboxed run. ``namespaces``: "require" (default) fails every run
    when the kernel refuses namespaces; "try" falls back to rlimits and the worker's audit
    hook (weaker: see docs/evals.md); "off" never creates them."""

    timeout_s: float = 20.0
    test_timeout_s: float = 5.0
    import_timeout_s: float = 5.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_size_mb: int = 8
    tmp_mb: int = 16
    open_files: int = 64
    processes: int = 256
    uid: int = 65534
    namespaces: Namespaces = "require"
    hide: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class UnitTest:
    name: str
    code: str


@dataclass(frozen=True, slots=True)
class UnitTestResult:
    name: str
    passed: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class SandboxResult:
    passed: bool
    reason: str
    tests: tuple[UnitTestResult, ...] = ()
    isolation: str | None = None
    duration_s: float = 0.0


@functools.cache
def _precompile() -> None:
    """Write the harness's bytecode once: it runs with -B, and compiling its four modules
    from source in every run would add ~10 ms (an installed package has it already)."""
    with contextlib.suppress(OSError):
        compileall.compile_dir(str(HERE), quiet=2)


def _hidden(limits: SandboxLimits) -> list[str]:
    """Paths the sandbox must not see even when a bound system directory holds them."""
    package_root = str(HERE.parents[2])  # the tree holding evals/ (its datasets included)
    paths = {package_root, os.getcwd(), os.path.realpath(sys.prefix), *limits.hide}
    return sorted(p for p in paths if p and p != "/")


def _config(limits: SandboxLimits, root: str) -> dict[str, Any]:
    python = os.path.realpath(sys.executable)
    prefixes = {sys.base_prefix, os.path.realpath(sys.base_prefix), str(Path(python).parent.parent)}
    return {
        "root": root, "python": python, "python_prefixes": sorted(prefixes), "hide": _hidden(limits),
        "namespaces": limits.namespaces, "uid": limits.uid, "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s, "file_size_mb": limits.file_size_mb, "tmp_mb": limits.tmp_mb,
        "open_files": limits.open_files, "processes": limits.processes, "parent": os.getpid(),
    }  # fmt: skip


def _verdict(raw: bytes, nonce: str, tests: Sequence[UnitTest]) -> SandboxResult:
    try:
        size = int.from_bytes(raw[:4], "big")
        if len(raw) != 4 + size:
            raise wire.WireError("not exactly one message")
        data = wire.decode(raw[4:])
    except wire.WireError as exc:
        return SandboxResult(False, f"the harness's report is malformed ({exc})")
    if not isinstance(data, dict) or not secrets.compare_digest(str(data.get("nonce", "")), nonce):
        return SandboxResult(False, "the result does not carry this run's nonce")
    reported = data.get("tests")
    if not isinstance(reported, list) or [t.get("name") for t in reported if isinstance(t, dict)] != [
        t.name for t in tests
    ]:
        return SandboxResult(False, "the result does not list the tests that were sent")
    outcomes = tuple(
        UnitTestResult(
            str(t["name"]), t.get("passed") is True, None if t.get("error") is None else str(t["error"])
        )
        for t in reported
    )
    isolation = str(data.get("isolation"))
    failed = [o for o in outcomes if not o.passed]
    if not failed:
        return SandboxResult(True, f"{len(outcomes)}/{len(outcomes)} tests passed", outcomes, isolation)
    first = failed[0]
    reason = f"{len(outcomes) - len(failed)}/{len(outcomes)} tests passed; {first.name}: {first.error}"
    return SandboxResult(False, reason, outcomes, isolation)


def run_tests(
    program: str,
    tests: Sequence[UnitTest],
    *,
    entry_point: str,
    setup: str = "",
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Execute ``program`` in the worker and ``setup`` + each test in the harness, where
    ``candidate`` (and the name ``entry_point``) calls the program's ``entry_point``."""
    limits = limits or SandboxLimits()
    if not tests:
        return SandboxResult(False, "no tests to run")
    if "\x00" in program:
        return SandboxResult(False, "the program contains a NUL byte")
    _precompile()
    nonce = secrets.token_hex(32)
    request = wire.frame({
        "nonce": nonce, "program": program, "setup": setup, "entry_point": entry_point,
        "tests": [{"name": t.name, "code": t.code} for t in tests],
        "test_timeout_s": limits.test_timeout_s, "import_timeout_s": limits.import_timeout_s,
    })  # fmt: skip
    started = time.monotonic()
    root = tempfile.mkdtemp(prefix="liftgate-sandbox-")
    try:
        if os.geteuid() == 0:
            os.chown(root, limits.uid, limits.uid)  # the working directory without namespaces
        cmd = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", _BOOT,
               wire.encode(_config(limits, root)).hex()]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={}, cwd=root, start_new_session=True, close_fds=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(request, timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return SandboxResult(False, f"timed out after {limits.timeout_s:g} s", (), None,
                                 time.monotonic() - started)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return SandboxResult(False, f"the harness exited with status {proc.returncode}: {tail[0][:300]}",
                             (), None, elapsed)  # fmt: skip
    result = _verdict(out, nonce, tests)
    if result.passed and limits.namespaces == "require" and result.isolation != "namespaces":
        return SandboxResult(False, "the run was not isolated by namespaces", result.tests, result.isolation)
    return SandboxResult(result.passed, result.reason, result.tests, result.isolation, elapsed)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the run's process group; only while its leader is unreaped, so the id is ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=5)
