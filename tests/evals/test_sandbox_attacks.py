"""The code sandbox against programs that try to pass without solving the task.

Every test runs real sandboxed subprocesses. The task: ``add(a, b)`` returns a + b. Each
attack either never returns the right values or tries to fake the verdict; all must fail,
in bounded time, leaving no process behind.
"""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from evals.scorers.sandbox import SandboxLimits, UnitTest, run_tests

TESTS = [
    UnitTest("small", "assert candidate(1, 2) == 3"),
    UnitTest("negative", "assert add(-5, 2) == -3"),
    UnitTest("strings", "assert candidate('a', 'b') == 'ab'"),
]
FAST = SandboxLimits(timeout_s=10, test_timeout_s=1.5, import_timeout_s=3, cpu_s=5)
ROOT = Path(__file__).resolve().parents[2]


def run(program: str, tests: list[UnitTest] = TESTS, limits: SandboxLimits = FAST) -> tuple[bool, str]:
    result = run_tests(textwrap.dedent(program), tests, entry_point="add", limits=limits)
    return result.passed, result.reason


def test_a_correct_program_passes_in_a_namespace_sandbox() -> None:
    result = run_tests("def add(a, b):\n    return a + b\n", TESTS, entry_point="add", limits=FAST)
    assert result.passed, result.reason
    assert result.isolation == "namespaces"
    assert [t.passed for t in result.tests] == [True, True, True]


def test_a_wrong_program_fails_and_names_the_failing_test() -> None:
    passed, reason = run("def add(a, b):\n    return a - b\n")
    assert not passed
    assert "small" in reason


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "def add(a, b):\n    import sys\n    sys.exit(0)\n",
        "def add(a, b):\n    import os\n    os._exit(0)\n",
        "raise SystemExit(0)\n",
        "def add(a, b):\n    raise KeyboardInterrupt\n",
    ],
    ids=["sys.exit-at-import", "os._exit-at-import", "sys.exit-in-call", "os._exit-in-call", "SystemExit",
         "KeyboardInterrupt"],
)  # fmt: skip
def test_exiting_early_fails(program: str) -> None:
    passed, _ = run(program)
    assert not passed


@pytest.mark.parametrize(
    "program",
    [
        """
        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __bool__(self): return True
            __hash__ = object.__hash__
        def add(a, b): return Anything()
        """,
        """
        class Int(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def add(a, b): return Int(0)
        """,
        """
        class Str(str):
            def __eq__(self, other): return True
            __hash__ = str.__hash__
        def add(a, b): return Str('')
        """,
        """
        class Weird(list):
            def __eq__(self, other): return True
        def add(a, b): return Weird()
        """,
    ],
    ids=["object", "int-subclass", "str-subclass", "list-subclass"],
)
def test_a_result_whose_eq_is_always_true_fails(program: str) -> None:
    passed, reason = run(program)
    assert not passed
    assert "not plain data" in reason


@pytest.mark.parametrize(
    "program",
    [
        "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\ndef add(a, b): return 0\n",
        "import builtins\n_orig = builtins.__import__\nbuiltins.abs = lambda x: 0\ndef add(a, b): return None\n",
        "import sys\nsys.modules['builtins'].__dict__['__import__'] = None\ndef add(a, b): return 0\n",
        # The assertion can only be "disabled" in the process that runs it; the tests are not here.
        "import sys\nsys.flags = None\n__debug__\ndef add(a, b): return 0\n",
        "import sys\nsys.excepthook = lambda *a: None\nsys.stdout.write('3 tests passed\\n')\ndef add(a, b): return 1\n",
    ],
    ids=["AssertionError", "abs", "__import__", "flags", "excepthook"],
)
def test_patching_builtins_or_assert_handling_has_no_effect_on_the_tests(program: str) -> None:
    passed, _ = run(program)
    assert not passed


def test_printing_passed_or_a_forged_report_fails() -> None:
    program = """
    import sys, os
    fake = '{"nonce": "0" , "tests": [{"name": "small", "passed": true}]}'
    for stream in (sys.stdout, sys.stderr):
        stream.write('PASSED\\n' * 1000 + fake + '\\n')
        stream.flush()
    for fd in range(3, 20):
        try:
            os.write(fd, b'\\x00\\x00\\x00\\x10' + b'PASSED' * 10)
        except OSError:
            pass
    def add(a, b): return 0
    """
    passed, _ = run(program)
    assert not passed


def test_flooding_stdout_and_stderr_fails_in_bounded_time() -> None:
    program = """
    import sys
    def add(a, b):
        for _ in range(200_000):
            sys.stdout.write('PASSED ' * 100)
            sys.stderr.write('ok ' * 100)
        return 0
    """
    started = time.monotonic()
    passed, _ = run(program)
    assert not passed
    assert time.monotonic() - started < FAST.timeout_s + 5


def test_forking_fails_and_leaves_no_process() -> None:
    program = """
    import os
    def add(a, b):
        if os.fork() == 0:
            os._exit(0)
        return a + b
    """
    passed, reason = run(program)
    assert not passed
    assert "os.fork is not allowed" in reason


def test_subprocesses_and_multiprocessing_are_refused() -> None:
    for program in (
        "import subprocess\ndef add(a, b):\n    return int(subprocess.check_output(['echo', str(a + b)]))\n",
        "import os\ndef add(a, b):\n    os.system('true')\n    return a + b\n",
        "import multiprocessing as mp\ndef add(a, b):\n    p = mp.Process(target=print)\n    p.start()\n    return a + b\n",
    ):
        passed, _ = run(program)
        assert not passed


def _sandbox_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_sleeping_forever_times_out_and_every_process_of_the_run_is_gone() -> None:
    marker = "sleeps-forever-" + os.urandom(4).hex()
    program = f"""
    import time
    MARK = {marker!r}
    time.sleep(3600)
    def add(a, b): return a + b
    """
    limits = SandboxLimits(timeout_s=3, test_timeout_s=1, import_timeout_s=10, cpu_s=5)
    started = time.monotonic()
    passed, reason = run(program, limits=limits)
    assert not passed
    assert time.monotonic() - started < 8
    assert "timed out" in reason or "did not answer" in reason
    deadline = time.monotonic() + 5
    while _sandbox_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes(marker) == []


def test_a_call_that_never_returns_fails_that_test_and_all_later_ones() -> None:
    program = """
    def add(a, b):
        while a == 1:
            pass
        return a + b
    """
    result = run_tests(textwrap.dedent(program), TESTS, entry_point="add", limits=FAST)
    assert not result.passed
    assert [t.passed for t in result.tests] == [False, False, False]
    assert "timed out" in (result.tests[0].error or "")


def test_detaching_into_a_new_session_does_not_survive_the_run() -> None:
    marker = "setsid-" + os.urandom(4).hex()
    program = f"""
    import os, time
    MARK = {marker!r}
    os.setsid()
    def add(a, b):
        time.sleep(3600)
    """
    limits = SandboxLimits(timeout_s=3, test_timeout_s=1, import_timeout_s=3, cpu_s=5)
    passed, _ = run(program, limits=limits)
    assert not passed
    deadline = time.monotonic() + 5
    while _sandbox_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes(marker) == []


@pytest.mark.parametrize(
    "target",
    [
        str(Path(__file__)),
        str(ROOT / "evals" / "datasets" / "builtin" / "code.py"),
        "/proc/self/cmdline",
        "/etc/passwd",
        "/",
        "/proc",
    ],
)
def test_reading_the_test_file_or_anything_outside_the_sandbox_fails(target: str) -> None:
    program = f"""
    import os
    def add(a, b):
        path = {target!r}
        if os.path.isdir(path):
            return os.listdir(path)
        with open(path, 'rb') as fh:
            return fh.read()
    """
    passed, reason = run(program, tests=[UnitTest("read", "assert candidate(1, 2) == 3")])
    assert not passed
    assert "PermissionError" in reason or "FileNotFoundError" in reason


def test_the_tests_are_not_in_the_candidates_memory() -> None:
    program = """
    import gc, sys
    def add(a, b):
        seen = [o for o in gc.get_objects() if isinstance(o, str) and 'candidate(1, 2)' in o]
        return a + b if seen else -1
    """
    passed, _ = run(program)
    assert not passed
    program = """
    import sys
    def add(a, b):
        frame = sys._getframe()
        while frame.f_back is not None:
            frame = frame.f_back
        names = str(frame.f_globals.keys()) + str(frame.f_locals.keys())
        return a + b if 'nonce' in names or 'tests' in names else -1
    """
    passed, _ = run(program)
    assert not passed


@pytest.fixture
def listener() -> Iterator[int]:
    """A real TCP server on 127.0.0.1 that records whether anyone connected."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    hits: list[int] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                hits.append(1)
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=2)
    server.close()
    assert hits == [], "the sandboxed program reached the listener"


def test_connecting_to_127_0_0_1_fails(listener: int) -> None:
    program = f"""
    import socket
    def add(a, b):
        s = socket.create_connection(('127.0.0.1', {listener}), timeout=1)
        s.close()
        return a + b
    """
    passed, reason = run(program, tests=[UnitTest("net", "assert candidate(1, 2) == 3")])
    assert not passed
    assert "socket" in reason


def test_memory_and_recursion_bombs_fail_without_hurting_the_caller() -> None:
    for program in (
        "def add(a, b):\n    x = bytearray(4 * 1024 ** 3)\n    return a + b\n",
        "def add(a, b):\n    return add(a, b)\n",
        "def add(a, b):\n    return 'x' * (10 ** 8)\n",
    ):
        passed, _ = run(program)
        assert not passed


def test_writing_a_huge_file_is_stopped_by_the_file_size_limit() -> None:
    program = """
    def add(a, b):
        with open('big', 'wb') as fh:
            for _ in range(64):
                fh.write(b'x' * 1024 * 1024)
        return a + b
    """
    passed, _ = run(program, tests=[UnitTest("write", "assert candidate(1, 2) == 3")])
    assert not passed


def test_a_test_that_never_calls_the_candidate_does_not_pass() -> None:
    result = run_tests("def add(a, b): return a + b\n", [UnitTest("vacuous", "assert True")],
                       entry_point="add", limits=FAST)  # fmt: skip
    assert not result.passed
    assert "never called" in result.reason


def test_exceptions_the_tests_expect_are_seen_as_that_builtin_type() -> None:
    tests = [
        UnitTest(
            "raises",
            "try:\n    candidate(-1, 0)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass\n",
        )
    ]
    ok = "def add(a, b):\n    if a < 0:\n        raise ValueError('negative')\n    return a + b\n"
    assert run_tests(ok, tests, entry_point="add", limits=FAST).passed
    fake = "class ValueError(Exception):\n    pass\ndef add(a, b):\n    raise ValueError('not the builtin one')\n"
    assert not run_tests(fake, tests, entry_point="add", limits=FAST).passed


def test_nul_bytes_and_empty_test_lists_fail_closed() -> None:
    assert not run_tests("def add(a, b): return a + b\x00", TESTS, entry_point="add", limits=FAST).passed
    assert not run_tests("def add(a, b): return a + b", [], entry_point="add", limits=FAST).passed


def test_arguments_are_plain_data_copies() -> None:
    tests = [UnitTest("mutation", "xs = [3, 1]\nassert candidate(xs, []) == [1, 3]\nassert xs == [3, 1]")]
    program = "def add(xs, ys):\n    xs.sort()\n    return xs + ys\n"
    assert run_tests(program, tests, entry_point="add", limits=FAST).passed
