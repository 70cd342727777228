"""pytest hooks of the secret scan (``LIFTGATE_TEST_SECRET_SCAN=1``; see ``tests.known_secrets``).

Loaded by tests/conftest.py, and on its own with ``-p tests.secret_scan`` (the scan's own test
runs an inner pytest session with it). A finding fails the session: it is listed at the end,
each secret by its prefix only.
"""

from __future__ import annotations

import os

import pytest

from tests import known_secrets

_leaks: list[str] = []


def enabled() -> bool:
    return os.environ.get("LIFTGATE_TEST_SECRET_SCAN") == "1"


@pytest.fixture(scope="session", autouse=True)
def _secret_scan_log_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Where services started by tests write their logs (``known_secrets.service_log``), and
    where the scan reads every ``*.log`` at the end."""
    known_secrets.LOG_ROOT[:] = [tmp_path_factory.getbasetemp()]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every test's captured stdout, stderr and log records, checked for registered secrets."""
    if not enabled():
        return
    for title, content in report.sections:
        found = known_secrets.leaks(content)
        line = f"{report.nodeid} [{title}]: {', '.join(sorted(found))}"
        if found and line not in _leaks:  # a later phase's report repeats earlier sections
            _leaks.append(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not enabled():
        return
    for root in known_secrets.LOG_ROOT:
        for path, found in known_secrets.leaks_in_files(root).items():
            _leaks.append(f"{path}: {', '.join(sorted(found))}")
    _leaks.extend(known_secrets.FOUND)
    if _leaks:
        session.config.get_terminal_writer().line(
            "secrets found in logs:\n  " + "\n  ".join(_leaks), red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        session.config.get_terminal_writer().line(
            f"secret scan: none of {len(known_secrets.REGISTERED)} secrets found in any log", green=True
        )
