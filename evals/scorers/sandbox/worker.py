"""The sandbox's worker: executes the candidate program and answers calls with plain data.

Started by the harness as a fresh interpreter (``python -I -S -B -c``, the code given on the
command line, since the worker's filesystem holds no liftgate files) so its memory holds
nothing of the harness's: no test, no nonce, no ctypes. Before the program runs it installs
an audit hook that refuses network, subprocesses, signals to other processes, ctypes,
links/renames/permission changes, and any file outside the Python library directory, the
working directory and four character devices. Stdlib only.
"""

from __future__ import annotations

import builtins
import os
import sys

import wire

TYPE_CHECKING = False  # typing's import costs the sandbox ~15 ms per run
if TYPE_CHECKING:
    from typing import Any

_DENIED_PREFIXES = ("socket.", "subprocess.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
                    "os.forkpty", "os.kill", "os.killpg", "os.system", "os.symlink", "os.link", "os.rename",
                    "os.chmod", "os.chown", "os.chroot", "resource.", "signal.pthread_kill", "pty.",
                    "shutil.", "gc.", "sys.remote_exec", "cpython.remote")  # fmt: skip
_DENIED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "pty", "gc"}
_PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rmdir", "os.utime"}


def allowed_paths() -> tuple[str, ...]:
    libdir = os.path.dirname(os.__file__)
    devices = tuple(f"/dev/{d}" for d in ("null", "zero", "urandom", "random"))
    return (libdir, os.path.realpath(libdir), os.getcwd(), *devices)


def audit_hook(allowed: tuple[str, ...]) -> Any:
    prefixes = tuple(a.rstrip("/") + "/" for a in allowed)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(_DENIED_PREFIXES):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in _DENIED_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event in _PATH_EVENTS and args:
            path = args[0]
            if path is None or type(path) is int:
                return  # an already open descriptor: no new access
            real = os.path.realpath(os.fsdecode(path))
            inside = real in allowed or real.startswith(prefixes)
            if not inside or "site-packages" in real or "dist-packages" in real:
                raise PermissionError(f"sandbox: no access to {real}")

    return hook


#: The builtin exception classes as they were before the program ran (it may rebind names).
_BUILTIN_EXCEPTIONS = {
    v: k for k, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
}


def _exception_name(exc: BaseException) -> str:
    name = _BUILTIN_EXCEPTIONS.get(type(exc))
    return name if name is not None else "CandidateError"


def serve(rfd: int, wfd: int) -> None:
    request = wire.recv(rfd)
    namespace: dict[str, Any] = {"__name__": "candidate", "__builtins__": builtins}
    try:
        code = compile(request["program"], "<candidate>", "exec", dont_inherit=True, optimize=0)
        exec(code, namespace)
    except BaseException as exc:
        wire.send(wfd, {"op": "error", "type": type(exc).__name__, "message": str(exc)[:2000]})
        return
    wire.send(wfd, {"op": "loaded"})
    while True:
        call = wire.recv(rfd)
        reply: dict[str, Any] = {"id": call["id"]}
        try:
            fn = namespace.get(call["fn"])
            if not callable(fn):
                raise NameError(f"the program defines no function {call['fn']!r}")
            reply["ok"] = fn(*call["args"], **call["kwargs"])
        except BaseException as exc:
            reply["raise"] = [_exception_name(exc), f"{type(exc).__name__}: {exc}"[:2000]]
        try:
            frame = wire.frame(reply)
        except wire.WireError as exc:
            frame = wire.frame({"id": call["id"], "raise": ["TypeError", f"the candidate returned {exc}"]})
        while frame:
            frame = frame[os.write(wfd, frame) :]


def main(rfd: int, wfd: int) -> None:
    sys.addaudithook(audit_hook(allowed_paths()))
    try:
        serve(rfd, wfd)
    finally:
        os._exit(0)
