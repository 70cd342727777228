"""The secrets the tests hand to services (tokens, keys, passwords), so a run can be checked
for any of them reaching a log: ``LIFTGATE_TEST_SECRET_SCAN=1`` (on in every CI run, see
scripts/test) makes the session fail when one appears in a test's captured output (stdout,
stderr, log records — subprocesses that inherit the test's descriptors included), in a
``*.log`` file under pytest's temp dir (where the services tests start write their logs:
:func:`service_log`), or in a directory a test hands to :func:`scan_files` before deleting it.
The hooks that do it are in ``tests.secret_scan``.
"""

from __future__ import annotations

import itertools
import re
import secrets
from pathlib import Path
from typing import IO

REGISTERED: set[str] = set()
#: Leaks found by :func:`scan_files` during the session (reported at its end).
FOUND: list[str] = []
#: pytest's temp root for this session (set by ``tests.secret_scan`` as the session starts).
LOG_ROOT: list[Path] = []
_counter = itertools.count()


def secret(prefix: str) -> str:
    """A fresh secret for a test to use, remembered for the scan."""
    value = f"{prefix}-{secrets.token_hex(16)}"
    REGISTERED.add(value)
    return value


def remember(value: str) -> None:
    """A secret something else generated (``liftgate up``'s tokens), searched for like ours."""
    if len(value) >= 16:  # a short value would match by accident, and no real secret is short
        REGISTERED.add(value)


def leaks(text: str) -> list[str]:
    """The registered secrets found in ``text`` (shown by their prefix only)."""
    return [_shown(s) for s in REGISTERED if s in text]


def _shown(value: str) -> str:
    prefix = value.rsplit("-", 1)[0] if "-" in value else ""
    return (prefix or value[:4]) + "-…"


def leaks_in_files(root: Path, pattern: str = "*.log") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in root.rglob(pattern):
        try:
            found = leaks(path.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            out[str(path)] = found
    return out


def scan_files(root: Path, pattern: str = "*.log") -> None:
    """Search ``root``'s logs now (for a directory outside pytest's temp root, or about to be
    deleted); what is found fails the session at its end."""
    for path, found in leaks_in_files(root, pattern).items():
        FOUND.append(f"{path}: {', '.join(sorted(found))}")


def service_log(name: str) -> IO[bytes]:
    """A new log file for a service a test starts (its stdout and stderr), under pytest's temp
    root where the session's scan reads it. Use it instead of ``subprocess.DEVNULL``: output
    thrown away cannot be checked."""
    root = LOG_ROOT[0] if LOG_ROOT else Path.cwd()
    folder = root / "service-logs"
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60]
    return (folder / f"{safe}-{next(_counter)}.log").open("ab")
