"""Confinement of the sandbox process, applied by the harness to itself before any untrusted
code exists in it (stdlib only: the harness runs with ``python -I -S``).

With namespaces (root, or any user where unprivileged user namespaces are allowed):

* new network namespace: only a loopback interface, and it is down — ``connect`` to
  127.0.0.1 fails with "Network is unreachable";
* new PID namespace: the worker is PID 1 of it, so every process it might start dies with it
  and no process outside is visible or signallable;
* new mount namespace and ``pivot_root`` into an empty tmpfs holding read-only binds of the
  system and Python library directories (site-packages, the liftgate tree and the caller's
  working directory hidden under empty mounts), ``/dev/{null,zero,urandom,random}`` and a
  small writable ``/tmp`` (the working directory); no ``/proc``;
* as root, then ``setuid``/``setgid`` to an unprivileged uid (nobody); without root, all
  capabilities are dropped. ``no_new_privs`` and non-dumpable in both cases.

Resource limits (always): address space, CPU seconds (soft = hard, so SIGKILL), file size,
open files, core dumps off, processes (as root, for the sandbox uid).
"""

from __future__ import annotations

import ctypes
import os
import resource

TYPE_CHECKING = False  # typing's import costs the sandbox ~15 ms per run
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin")
DEVICES = ("null", "zero", "urandom", "random")

_libc = ctypes.CDLL(None, use_errno=True)


class ConfineError(OSError):
    pass


def _ok(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise ConfineError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if x is None else x.encode() for x in (src, target, fstype, data)]
    _ok(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def prctl(option: int, value: int) -> None:
    _ok(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def set_limits(cfg: dict[str, Any]) -> None:
    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
        (resource.RLIMIT_CPU, cfg["cpu_s"]),
        (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, cfg["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ]
    for what, value in limits:
        resource.setrlimit(what, (value, value))


def _hidden_paths(cfg: dict[str, Any], prefixes: list[str]) -> list[str]:
    found = set(cfg.get("hide", ()))
    for top in prefixes:
        for lib in (f"{top}/lib", f"{top}/local/lib"):
            try:
                versions = [d for d in os.listdir(lib) if d.startswith("python3")]
            except OSError:
                continue
            for version in versions:
                found.update(f"{lib}/{version}/{d}" for d in ("site-packages", "dist-packages"))
    return sorted(p for p in found if os.path.isdir(p))


def _bind_ro(path: str, target: str, root: bool) -> None:
    _mount(path, target, None, MS_BIND | MS_REC)
    try:
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except ConfineError:
        # In a user namespace a remount may not drop a flag the source mount holds locked;
        # the files stay protected by their ordinary permissions (we are no longer root).
        if root:
            raise


def _populate(newroot: str, cfg: dict[str, Any], root: bool) -> None:
    prefixes = [p for p in SYSTEM_DIRS if os.path.lexists(p)]
    for extra in cfg["python_prefixes"]:
        if not any(extra == p or extra.startswith(p + "/") for p in prefixes):
            prefixes.append(extra)
    for path in prefixes:
        target = newroot + path
        if os.path.islink(path):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, exist_ok=True)
        _bind_ro(path, target, root)
    for path in _hidden_paths(cfg, prefixes):
        if os.path.isdir(newroot + path):
            _mount("tmpfs", newroot + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
    os.makedirs(newroot + "/dev")
    for dev in DEVICES:
        with open(f"{newroot}/dev/{dev}", "w"):
            pass
        _mount(f"/dev/{dev}", f"{newroot}/dev/{dev}", None, MS_BIND)
    os.makedirs(newroot + "/tmp")
    _mount("tmpfs", newroot + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_mb']}m,mode=1777")


def _pivot(newroot: str) -> None:
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    os.chdir(newroot)
    if number is None:
        os.chroot(".")  # safe only because the root case drops to an unprivileged uid next
    else:
        _ok(_libc.syscall(number, b".", b"."), "pivot_root")
        _ok(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _drop_capabilities() -> None:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]  # fmt: skip

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    _ok(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def confine(cfg: dict[str, Any]) -> str:
    """Apply what ``cfg`` asks; returns the isolation achieved: "namespaces" or "rlimits"."""
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    achieved = "rlimits"
    if cfg["namespaces"] != "off":
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)
        if _libc.unshare(flags) == 0:
            if not root:
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                                   ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
                    with open(f"/proc/self/{name}", "w") as fh:
                        fh.write(text)
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            newroot = cfg["root"]
            _mount("tmpfs", newroot, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            _populate(newroot, cfg, root)
            _pivot(newroot)
            os.chdir("/tmp")
            achieved = "namespaces"
        elif cfg["namespaces"] == "require":
            err = ctypes.get_errno()
            raise ConfineError(err, f"cannot create namespaces: {os.strerror(err)}")
    if achieved != "namespaces":
        os.chdir(cfg["root"])
    set_limits(cfg)
    if root:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))
    elif achieved == "namespaces":
        _drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    return achieved
