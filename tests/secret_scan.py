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
#: Secrets the scan searched for (a controller adds up its workers').
_secrets = [0]
#: The pytest-xdist workers that reported to this controller.
_workers: list[str] = []


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
    if not _workers:  # a controller's own secrets are those its workers imported too
        _secrets[0] += len(known_secrets.REGISTERED)
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        # A pytest-xdist worker: its findings go to the controller, which reports them all
        # and fails the run (a worker's own exit status and terminal are not the run's).
        output["secret_leaks"] = list(_leaks)
        output["secrets_registered"] = _secrets[0]
        return
    if _leaks:
        session.config.get_terminal_writer().line(
            "secrets found in logs:\n  " + "\n  ".join(_leaks), red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        session.config.get_terminal_writer().line(
            f"secret scan: none of {_secrets[0]} secrets found in any log", green=True
        )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller: a worker finished; keep what its scan found."""
    if not enabled():
        return
    output = getattr(node, "workeroutput", {})
    _workers.append(str(getattr(node, "gateway", node)))
    _leaks.extend(output.get("secret_leaks", []))
    _secrets[0] += int(output.get("secrets_registered", 0))
    if error is not None and "secret_leaks" not in output:
        # A worker that died before its scan: the run cannot say its logs are clean.
        _leaks.append(f"worker {getattr(node, 'gateway', node)} ended before its scan ran: {error}")
