"""The code sandbox's inside: two processes, tests in one, candidate code in the other.

Started by :mod:`evals.scorers.sandbox.runner` as ``python -I -S -B -c <bootstrap> CONFIG``
with an empty environment, in its own session. Stdlib only.

1. The *harness* process confines itself (:mod:`confine`) and forks the *worker* before it
   has read anything secret, so the worker's memory never holds the tests, the expected
   values or the nonce.
2. The harness then reads the request (nonce, program, trusted setup code, tests) from
   stdin and sends only the program to the worker, which executes it in a fresh namespace
   under an audit hook (no sockets, subprocesses, signals, ctypes; files only inside the
   sandbox's library directories and its ``/tmp``).
3. The tests run in the harness. ``candidate`` there is a proxy: each call sends its
   arguments to the worker as plain data and gets back plain data or an exception's type
   and message (:mod:`wire`). The candidate can therefore not patch the test's builtins,
   ``assert``, comparison operators or exit path, not read the test code, and not return an
   object with a rigged ``__eq__``: everything the test compares was rebuilt from JSON here.
4. A test passes only when it ran to its end, called the candidate at least once, and the
   worker was alive and in step for all of it. The harness writes one JSON line to its
   stdout (the worker's stdout and stderr are /dev/null) carrying the nonce; the caller
   accepts nothing else (exit code 0, nonce, one result per test it sent).
"""

from __future__ import annotations

import _signal as signal  # not signal: its enums cost ~7 ms per run
import builtins
import os
import sys
import time

import confine
import wire

TYPE_CHECKING = False  # typing's import costs the sandbox ~15 ms per run
if TYPE_CHECKING:
    from typing import Any

#: How the worker interpreter loads its two modules from source given on its command line.
WORKER_BOOT = """import sys, types
for name, src in (("wire", sys.argv[1]), ("worker", sys.argv[2])):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(src, name + ".py", "exec"), module.__dict__)
sys.modules["worker"].main(int(sys.argv[3]), int(sys.argv[4]))
"""


class WorkerLost(BaseException):
    """The worker died, hung or broke the protocol: every later test fails too. A
    BaseException, so a test's ``except Exception`` cannot swallow it."""


class TestTimeout(BaseException):
    pass


class CandidateError(Exception):
    """The candidate raised an exception whose type is not a builtin one."""


class CandidateAbort(BaseException):
    """The candidate raised SystemExit, KeyboardInterrupt or another non-Exception."""


class Channel:
    def __init__(self, pid: int, to_worker: int, from_worker: int) -> None:
        self.pid, self.to_worker, self.from_worker = pid, to_worker, from_worker
        self.lost: str | None = None
        self.calls = 0
        self._next = 0

    def kill(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        try:  # noqa: SIM105 - contextlib's import would cost every sandbox run
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def request(self, message: dict[str, Any], deadline: float | None) -> Any:
        if self.lost is not None:
            raise WorkerLost(self.lost)
        try:
            wire.send(self.to_worker, message)
            return wire.recv(self.from_worker, deadline)
        except TimeoutError:
            self.kill("the candidate did not answer in time")
        except (EOFError, OSError):
            self.kill("the candidate process exited")
        except wire.WireError:
            self.kill("the candidate process broke the protocol")
        except BaseException:
            self.kill("interrupted while waiting for the candidate")
            raise
        raise WorkerLost(self.lost)

    def call(self, fn: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._next += 1
        self.calls += 1
        message = {"op": "call", "id": self._next, "fn": fn, "args": list(args), "kwargs": dict(kwargs)}
        try:
            wire.encode(message)
        except wire.WireError as exc:
            raise TypeError(f"argument cannot be sent to the candidate: {exc}") from None
        reply = self.request(message, None)
        if type(reply) is not dict or reply.get("id") != self._next:
            self.kill("the candidate process broke the protocol")
            raise WorkerLost(self.lost)
        if "ok" in reply:
            return reply["ok"]
        raised = reply.get("raise")
        if type(raised) is not list or len(raised) != 2 or not all(type(x) is str for x in raised):
            self.kill("the candidate process broke the protocol")
            raise WorkerLost(self.lost)
        name, text = raised
        kind = getattr(builtins, name, None)
        if isinstance(kind, type) and issubclass(kind, Exception):
            raise kind(text)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            raise CandidateAbort(f"{name}: {text}")
        raise CandidateError(f"{name}: {text}")


class Candidate:
    """What the tests call: the program's function, reached through the channel."""

    def __init__(self, channel: Channel, name: str) -> None:
        self._channel, self.__name__ = channel, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.call(self.__name__, args, kwargs)


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout


def _run_test(
    channel: Channel, base: dict[str, Any], test: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    ns = dict(base)
    before = channel.calls
    error: str | None = None
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        exec(compile(test["code"], f"<test {test['name']}>", "exec", dont_inherit=True, optimize=0), ns)
    except TestTimeout:
        channel.kill("the test timed out")
        error = f"timed out after {timeout_s:g} s"
    except AssertionError as exc:
        error = f"assertion failed{': ' + str(exc)[:500] if str(exc) else ''}"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if error is None and channel.lost is not None:
        error = channel.lost
    if error is None and channel.calls == before:
        error = "the test never called the candidate"
    return {"name": test["name"], "passed": error is None, "error": error}


def _harness(cfg: dict[str, Any], isolation: str, pid: int, to_worker: int, from_worker: int) -> None:
    result_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - prints of the test code go nowhere
    request = wire.recv(0)
    channel = Channel(pid, to_worker, from_worker)
    out: dict[str, Any] = {
        "nonce": request["nonce"],
        "isolation": isolation,
        "import_error": None,
        "tests": [],
    }
    signal.signal(signal.SIGALRM, _on_alarm)
    deadline = time.monotonic() + float(request["import_timeout_s"])
    try:
        reply = channel.request({"op": "load", "program": request["program"]}, deadline)
        if type(reply) is not dict or reply.get("op") != "loaded":
            detail = f"{reply.get('type')}: {reply.get('message')}" if type(reply) is dict else "bad reply"
            channel.kill(f"the program failed to load: {detail}")
    except WorkerLost:
        pass
    out["import_error"] = channel.lost
    base: dict[str, Any] = {"__name__": "tests", "__builtins__": builtins}
    try:
        exec(compile(request["setup"], "<setup>", "exec", dont_inherit=True, optimize=0), base)
    except BaseException as exc:
        channel.kill(f"the test setup raised {type(exc).__name__}: {exc}")
    entry = Candidate(channel, request["entry_point"])
    base["candidate"] = base[request["entry_point"]] = entry
    for test in request["tests"]:
        out["tests"].append(_run_test(channel, base, test, float(request["test_timeout_s"])))
    channel.kill("finished")
    os.waitpid(pid, 0)
    data = wire.frame(out)
    while data:
        data = data[os.write(result_fd, data) :]


def _start_worker(cfg: dict[str, Any], sources: tuple[str, str]) -> tuple[int, int, int]:
    """Fork and exec the worker interpreter; returns (pid, fd to it, fd from it)."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    harness_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            # Killed with the harness, whatever the program does to its session or group.
            confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() not in (harness_pid, 0):  # 0: PID 1 of a new PID namespace
                os._exit(3)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.set_inheritable(to_r, True)
            os.set_inheritable(from_w, True)
            argv = [cfg["python"], "-I", "-S", "-B", "-c", WORKER_BOOT, *sources, str(to_r), str(from_w)]
            os.execve(cfg["python"], argv, {})
        finally:
            os._exit(3)
    os.close(to_r)
    os.close(from_w)
    return pid, to_w, from_r


def main() -> None:
    cfg = wire.decode(bytes.fromhex(sys.argv[1]))
    # Die with the process that asked for this run, even one killed before it could clean up.
    confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:
        os._exit(3)
    here = os.path.dirname(os.path.abspath(wire.__file__))
    sources = tuple(open(os.path.join(here, f)).read() for f in ("wire.py", "worker.py"))  # noqa: SIM115
    isolation = confine.confine(cfg)
    pid, to_worker, from_worker = _start_worker(cfg, sources)  # type: ignore[arg-type]
    _harness(cfg, isolation, pid, to_worker, from_worker)
