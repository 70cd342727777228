"""The secrets the tests hand to services (tokens, keys, passwords), so a run can be checked
for any of them reaching a log: ``LIFTGATE_TEST_SECRET_SCAN=1`` makes the session fail when
one appears in a test's captured output (stdout, stderr, log records — subprocesses that
inherit the test's descriptors included) or in a ``*.log`` file under pytest's temp dir.
"""

from __future__ import annotations

import secrets
from pathlib import Path

REGISTERED: set[str] = set()


def secret(prefix: str) -> str:
    """A fresh secret for a test to use, remembered for the scan."""
    value = f"{prefix}-{secrets.token_hex(16)}"
    REGISTERED.add(value)
    return value


def leaks(text: str) -> list[str]:
    """The registered secrets found in ``text`` (shown by their prefix only)."""
    return [s.rsplit("-", 1)[0] + "-…" for s in REGISTERED if s in text]


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
