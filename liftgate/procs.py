"""Child processes of ``liftgate up``: start, wait until ready, stop without orphans.

Every child runs in its own session (process group) so a terminal's Ctrl-C reaches only
``liftgate up``, which then stops the children in order; stopping signals the whole group,
so grandchildren (uvicorn workers) go too. On Linux each child also asks the kernel for
SIGTERM when its parent dies, so even a SIGKILLed ``liftgate up`` leaves no process behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from liftgate.interrupt import no_checkpoint

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class StartupError(RuntimeError):
    """A child did not become ready; the message includes the tail of its log."""


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
        self._log.flush()
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
        log.debug("started %s pid %s", self.name, self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, deadline: float, checkpoint: Callable[[], None] = no_checkpoint) -> None:
        """Poll ``health_url`` until it answers 2xx, the child exits, or the deadline passes;
        ``checkpoint`` is called on every round (``liftgate up``: raises on a stop signal)."""
        if self.health_url is None:
            return
        last = "no answer yet"
        while time.monotonic() < deadline:
            checkpoint()
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StartupError(f"{self.name} exited with code {code}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                    if 200 <= resp.status < 300:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise StartupError(f"{self.name} not ready at {self.health_url} ({last}):\n{self.log_tail()}")

    def signal_group(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout``, reap the child."""
        if self.proc is None:
            return
        self.signal_group(signal.SIGTERM)
        self.finish_stop(time.monotonic() + timeout)

    def finish_stop(self, deadline: float) -> None:
        """After a SIGTERM: wait until ``deadline``, then SIGKILL the group, reap the child."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", self.name)
        # The leader may be gone while a worker of its group lingers: kill the group anyway.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class Supervisor:
    """The children of one ``liftgate up``, stopped in reverse start order."""

    children: list[Child] = field(default_factory=list)
    #: Called while waiting for a child to be ready (``liftgate up``: raises on a stop signal).
    checkpoint: Callable[[], None] = no_checkpoint

    def start(self, child: Child, *, ready_timeout: float = 60.0) -> Child:
        self.checkpoint()
        self.children.append(child)
        child.start()
        child.wait_ready(time.monotonic() + ready_timeout, self.checkpoint)
        return child

    def first_dead(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every child at once, SIGKILL what still runs after ``timeout`` (in total).

        One shared deadline, not one per child in turn: a stack of five children stops
        within ``timeout`` + a few seconds however many of them are slow. Each child's stop
        time (or the kill) is logged, so a slow one can be named.
        """
        t0 = time.monotonic()
        children = list(reversed(self.children))
        for child in children:
            child.signal_group(signal.SIGTERM)
        for child in children:
            child.finish_stop(t0 + timeout)
            code = child.proc.returncode if child.proc else None
            log.info(
                "stopped %s (code %s) %.1f s after the stop request", child.name, code, time.monotonic() - t0
            )
        self.children.clear()
