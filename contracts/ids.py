"""Cheap unique ids for the hot path: request ids and UUIDv7 event ids.

``os.urandom`` is a syscall (~1–10 µs on a busy VM) and ``uuid6.uuid7()`` costs ~20 µs in
pure Python; a request needs three random ids. Both draw here from a buffer of
``os.urandom`` bytes refilled every 8 KiB, so ids stay unpredictable (request ids gate
feedback attribution, so a PRNG that can be reconstructed from observed ids is not used).
"""

from __future__ import annotations

import os
import time

_BUF_SIZE = 8192
_buf = b""
_pos = _BUF_SIZE


def _take(n: int) -> bytes:
    global _buf, _pos
    if _pos + n > len(_buf):
        _buf, _pos = os.urandom(_BUF_SIZE), 0
    out = _buf[_pos : _pos + n]
    _pos += n
    return out


def request_id() -> str:
    """``req-`` + 96 random bits in hex."""
    return "req-" + _take(12).hex()


def uuid7() -> str:
    """A UUID version 7 (RFC 9562): 48-bit Unix milliseconds, version, variant, random bits."""
    b = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + _take(10))
    b[6] = 0x70 | (b[6] & 0x0F)
    b[8] = 0x80 | (b[8] & 0x3F)
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
