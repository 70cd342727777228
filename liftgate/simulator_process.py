"""Run the model simulator in a child process (for `liftgate up`, tests and benchmarks).

    with SimulatorProcess([SimulatorModel("baseline"), SimulatorModel("candidate")]) as sim:
        client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x")

With ``port=0`` the child binds a free port and reports it on its first stdout line, so
concurrent test runs never race for a port.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

from liftgate.simulator_model import SimulatorModel

_READY = re.compile(r"listening on (http://\S+)")


class SimulatorProcess:
    """A ``python -m liftgate.simulator`` child; ``start()`` returns once it listens."""

    def __init__(
        self,
        models: Sequence[SimulatorModel],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        start_timeout_s: float = 30.0,
        cpu: int | None = None,
    ) -> None:
        self.models = list(models)
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.cpu = cpu
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "liftgate.simulator", "--host", self.host, "--port", str(self.port)]
        for model in self.models:
            cmd += ["--model", model.to_spec()]
        if self.cpu is not None:
            cmd = ["taskset", "-c", str(self.cpu), *cmd]
        return cmd

    def start(self) -> str:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # stderr is inherited: a pipe nobody reads would block a chatty child once it fills.
        self._proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, env=env)
        assert self._proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        line = b""
        try:
            while time.monotonic() < deadline and self._proc.poll() is None:
                if sel.select(timeout=0.1):
                    line = self._proc.stdout.readline()
                    match = _READY.search(line.decode(errors="replace"))
                    if match:
                        self.url = match.group(1)
                        return self.url
        finally:
            sel.close()
        code = self._proc.poll()
        self.stop()
        raise RuntimeError(
            f"simulator did not start (exit code {code}, last output {line!r}); see its stderr"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if proc.stdout is not None:
            with contextlib.suppress(OSError):
                proc.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
