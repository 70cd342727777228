"""Plain-data encoding between the sandbox's processes (stdlib only, no liftgate imports).

The worker process (which runs candidate code) and the harness process (which runs the
tests) exchange only *plain data*: values whose type is exactly one of None, bool, int,
float, complex, str, bytes, list, tuple, dict, set or frozenset, nested. Subclasses are
refused (``type(x) is int``, never ``isinstance``), so an object that overrides ``__eq__``,
``__bool__``, ``__abs__``… can never reach the test: the harness only compares values that
:func:`decode` rebuilt from bytes.

The format is a small tagged binary one (one tag byte, then a fixed-size payload or a
32-bit length/count); the decoder checks every tag, length and UTF-8 sequence and bounds
the size, so a hostile encoder can send wrong values but never an object of another type.
It needs no ``json`` (whose import alone costs the sandbox ~9 ms per run).
"""

from __future__ import annotations

import os
import select
import struct
import time

TYPE_CHECKING = False  # typing's import costs the sandbox ~15 ms per run
if TYPE_CHECKING:
    from typing import Any

MAX_FRAME = 16 * 1024 * 1024
MAX_NODES = 200_000
MAX_DEPTH = 100
MAX_INT_DIGITS = 4000
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")
_CONTAINERS: dict[type, bytes] = {list: b"l", tuple: b"t", set: b"S", frozenset: b"F"}
_BUILDERS: dict[int, Any] = {ord("l"): list, ord("t"): tuple, ord("S"): set, ord("F"): frozenset}


class WireError(ValueError):
    """A value that cannot cross (not plain data, too big, malformed)."""


def encode(value: Any) -> bytes:
    out: list[bytes] = []
    _enc(value, out, [MAX_NODES], 0)
    return b"".join(out)


def _enc(v: Any, out: list[bytes], budget: list[int], depth: int) -> None:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise WireError("value too large or too deeply nested")
    t = type(v)
    if v is None:
        out.append(b"n")
    elif t is bool:
        out.append(b"1" if v else b"0")
    elif t is int:
        try:
            digits = str(v).encode()
        except ValueError:
            raise WireError("integer too large") from None
        out += [b"i", _U32.pack(len(digits)), digits]
    elif t is float:
        out += [b"f", _F64.pack(v)]
    elif t is complex:
        out += [b"c", _F64.pack(v.real), _F64.pack(v.imag)]
    elif t is str or t is bytes:
        data = v.encode("utf-8", "surrogatepass") if t is str else v
        out += [b"s" if t is str else b"y", _U32.pack(len(data)), data]
    elif t in _CONTAINERS:
        out += [_CONTAINERS[t], _U32.pack(len(v))]
        for x in v:
            _enc(x, out, budget, depth + 1)
    elif t is dict:
        out += [b"d", _U32.pack(len(v))]
        for k, x in v.items():
            _enc(k, out, budget, depth + 1)
            _enc(x, out, budget, depth + 1)
    else:
        raise WireError(f"not plain data: a value of type {t.__name__}")


class _Reader:
    __slots__ = ("budget", "data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.budget = data, 0, MAX_NODES

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise WireError("truncated value")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def value(self, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0 or depth > MAX_DEPTH:
            raise WireError("value too large or too deeply nested")
        tag = self.take(1)[0]
        if tag == ord("n"):
            return None
        if tag in (ord("0"), ord("1")):
            return tag == ord("1")
        if tag == ord("i"):
            raw = self.take(self.u32())
            digits = raw[1:] if raw[:1] == b"-" else raw
            if not digits or len(digits) > MAX_INT_DIGITS or not digits.isdigit():
                raise WireError("malformed integer")
            return int(raw)
        if tag == ord("f"):
            return float(_F64.unpack(self.take(8))[0])
        if tag == ord("c"):
            return complex(_F64.unpack(self.take(8))[0], _F64.unpack(self.take(8))[0])
        if tag in (ord("s"), ord("y")):
            data = self.take(self.u32())
            if tag == ord("y"):
                return data
            try:
                return data.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                raise WireError("malformed text") from None
        if tag in _BUILDERS:
            items = [self.value(depth + 1) for _ in range(self._count())]
            try:
                return _BUILDERS[tag](items)
            except TypeError:
                raise WireError("unhashable set element") from None
        if tag == ord("d"):
            out = {}
            for _ in range(self._count()):
                key = self.value(depth + 1)
                try:
                    out[key] = self.value(depth + 1)
                except TypeError:
                    raise WireError("unhashable dict key") from None
            return out
        raise WireError(f"unknown tag {tag}")

    def _count(self) -> int:
        count = self.u32()
        if count > len(self.data) - self.pos:  # every element takes at least one byte
            raise WireError("truncated container")
        return count


def decode(data: bytes) -> Any:
    reader = _Reader(data)
    value = reader.value(0)
    if reader.pos != len(data):
        raise WireError("trailing bytes after the value")
    return value


def frame(message: Any) -> bytes:
    body = encode(message)
    if len(body) > MAX_FRAME:
        raise WireError("message too large")
    return _U32.pack(len(body)) + body


def read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(fd: int, deadline: float | None = None) -> Any:
    """One framed message: a 4-byte big-endian length, then one encoded value."""
    (size,) = _U32.unpack(read_exact(fd, 4, deadline))
    if size > MAX_FRAME:
        raise WireError("message too large")
    return decode(read_exact(fd, size, deadline))


def send(fd: int, message: Any) -> None:
    data = frame(message)
    while data:
        data = data[os.write(fd, data) :]
