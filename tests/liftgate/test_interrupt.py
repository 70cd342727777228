"""``liftgate up``'s stop signals: raised in its own code, recorded inside libraries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from liftgate.interrupt import StopSignals

HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
ROOT = Path(__file__).resolve().parents[2]


def test_a_signal_in_own_code_raises_at_once() -> None:
    stop = StopSignals(own_code=HERE)  # this test file plays liftgate's own code
    with pytest.raises(KeyboardInterrupt):
        stop.handler(signal.SIGTERM, sys._getframe())
    assert stop.received == 1


def test_a_signal_inside_a_library_is_recorded_and_raised_at_the_next_checkpoint() -> None:
    stop = StopSignals(own_code=HERE + "elsewhere" + os.sep)  # this frame is "a library"
    stop.checkpoint()  # nothing received yet: no-op
    stop.handler(signal.SIGTERM, sys._getframe())
    assert stop.received == 1
    with pytest.raises(KeyboardInterrupt):
        stop.checkpoint()


def test_a_second_signal_raises_wherever_it_lands() -> None:
    stop = StopSignals(own_code=HERE + "elsewhere" + os.sep)
    stop.handler(signal.SIGINT, sys._getframe())
    with pytest.raises(KeyboardInterrupt):
        stop.handler(signal.SIGINT, sys._getframe())
    with pytest.raises(KeyboardInterrupt):
        stop.handler(signal.SIGINT, None)


_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from liftgate.interrupt import StopSignals

    stop = StopSignals()
    stop.install((signal.SIGTERM,))
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        # What a library does when it builds a function from source (dataclasses,
        # namedtuple, pydantic): the signal lands in code run by exec of a string.
        exec("import time\\nt = time.monotonic()\\nwhile time.monotonic() - t < 1.0: pass")
        stop.checkpoint()
        print("not stopped")
    except KeyboardInterrupt:
        print("stopped")
    """
)


def test_a_stop_signal_landing_in_exec_built_library_code_still_ends_the_process_cleanly() -> None:
    """A handler that raised there (before) made CPython treat the interrupt as unhandled
    when it left the exec'd code: the process printed "stopped" and then killed itself by
    SIGINT (exit -2, or 130 where SIGINT is ignored): `liftgate up`'s clean stop reported as
    a failure. Now the signal is recorded there and raised at the checkpoint."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=30
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "stopped"), proc.stderr
