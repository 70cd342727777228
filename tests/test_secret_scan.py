"""The secret scan (``LIFTGATE_TEST_SECRET_SCAN=1``, on in every CI run) finds a planted leak
wherever a test run can write one: a service's log file, a child process's inherited stdout
or stderr, a log record; and lets a clean run pass. Each check runs a real inner pytest
session with the scan's hooks (``-p tests.secret_scan``) on a small test file written here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LEAKY = """
import logging, subprocess, sys
from pathlib import Path
from tests import known_secrets

def secret(prefix):  # what the outer test checks the report for (it must not print them)
    value = known_secrets.secret(prefix)
    with (Path(__file__).parent / "planted.txt").open("a") as f:
        f.write(value + "\\n")
    return value

service_log = known_secrets.service_log

def test_a_service_writes_a_secret_to_its_log_file():
    planted = secret("planted-file")
    with service_log("leaky-service") as log:
        subprocess.run([sys.executable, "-c", f"print('connecting with ' + {planted!r})"], stdout=log, check=True)

def test_a_child_process_writes_a_secret_to_the_inherited_stderr():
    planted = secret("planted-stderr")
    subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({planted!r})"], check=True)

def test_a_log_record_holds_a_secret():
    logging.getLogger("leaky").warning("upstream key %s rejected", secret("planted-record"))
"""

CLEAN = """
import logging, subprocess, sys
from tests.known_secrets import secret, service_log

def test_secrets_are_used_but_never_logged():
    planted = secret("planted-clean")
    with service_log("clean-service") as log:
        subprocess.run([sys.executable, "-c", "import sys; print(len(sys.argv[1]))", planted], stdout=log, check=True)
    logging.getLogger("clean").warning("upstream key %s… rejected", planted[:4])
"""


#: The inner session run serially and with two pytest-xdist workers (as scripts/test runs the
#: suite): a worker's findings must reach the controller and fail the run.
WORKERS = pytest.mark.parametrize("workers", [0, 2], ids=["serial", "xdist"])


def _inner_session(tmp_path: Path, source: str, workers: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "LIFTGATE_TEST_SECRET_SCAN": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", str(tmp_path / "test_inner.py"), "-c", str(tmp_path / "pytest.ini"),
           "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp"), "-p", "tests.secret_scan",
           "-p", "no:cacheprovider", "-q", *(["-n", str(workers)] if workers else [])]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@WORKERS
def test_the_scan_fails_a_run_whose_logs_hold_a_planted_secret_and_names_each_leak(
    tmp_path: Path, workers: int
) -> None:
    res = _inner_session(tmp_path, LEAKY, workers)
    out = res.stdout + res.stderr
    assert "3 passed" in out, out  # the tests themselves pass: the scan alone fails the run
    assert res.returncode == 1, out
    assert "secrets found in logs" in out, out
    listed = out.split("secrets found in logs", 1)[1]
    assert "service-logs/leaky-service-" in listed and "planted-file-…" in listed, listed
    assert "test_a_child_process_writes_a_secret_to_the_inherited_stderr" in listed, listed
    assert "planted-stderr-…" in listed and "planted-record-…" in listed, listed
    # A leak is reported by the secret's prefix only: the report is a log too.
    planted = (tmp_path / "planted.txt").read_text().split()
    assert len(planted) == 3 and not [p for p in planted if p in out], out


@WORKERS
def test_the_scan_passes_a_run_that_uses_secrets_without_logging_them(tmp_path: Path, workers: int) -> None:
    res = _inner_session(tmp_path, CLEAN, workers)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "secret scan: none of 1 secrets found in any log" in out, out
    assert list((tmp_path / "basetemp").glob("**/service-logs/clean-service-*.log")), "no service log written"


def test_the_suites_conftest_registers_every_hook_of_the_scan() -> None:
    # tests/conftest.py imports the scan's hooks by name: a hook it leaves out never runs in
    # the suite (the inner sessions above load the module whole, with -p, and would not notice).
    from tests import conftest, secret_scan

    hooks = [name for name in vars(secret_scan) if name.startswith("pytest_")]
    assert "pytest_testnodedown" in hooks and "pytest_sessionfinish" in hooks
    assert [name for name in hooks if getattr(conftest, name, None) is not getattr(secret_scan, name)] == []
