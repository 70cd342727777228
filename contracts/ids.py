"""Unique ids: request ids and UUIDv7 event ids (the project's one UUIDv7 implementation).

A syscall per id (``os.urandom``) would be a visible share of a request's CPU, and a
request needs three random ids, so both draw from a buffer of ``os.urandom`` bytes refilled
every 8 KiB: ids stay unpredictable (request ids gate feedback attribution, so a PRNG that
can be reconstructed from observed ids is not used). A forked child drops the buffer it
inherited, so parent and child never hand out the same bytes.
"""

from __future__ import annotations

import os
import time

_BUF_SIZE = 8192
_buf = b""
_pos = _BUF_SIZE
_last_ms = 0  # uuid7's millisecond and counter
_seq = 0


def _take(n: int) -> bytes:
    global _buf, _pos
    if _pos + n > len(_buf):
        _buf, _pos = os.urandom(_BUF_SIZE), 0
    out = _buf[_pos : _pos + n]
    _pos += n
    return out


def _forget() -> None:
    global _buf, _pos
    _buf, _pos = b"", _BUF_SIZE


os.register_at_fork(after_in_child=_forget)


def request_id() -> str:
    """``req-`` + 96 random bits in hex."""
    return "req-" + _take(12).hex()


def uuid7() -> str:
    """A UUID version 7 (RFC 9562): 48-bit Unix milliseconds, version, a 12-bit counter,
    variant, 62 random bits. Ids of one process sort in the order they were made: within a
    millisecond (or when the clock steps back) the counter counts on (RFC 9562, method 1);
    it starts at a random value below 2048 in each new millisecond."""
    global _last_ms, _seq
    ms = time.time_ns() // 1_000_000
    if ms > _last_ms:
        _last_ms = ms
        _seq = int.from_bytes(_take(2), "big") & 0x7FF
    else:
        _seq += 1
        if _seq > 0xFFF:  # 4096 ids in one millisecond: borrow the next one
            _last_ms += 1
            _seq = 0
        ms = _last_ms
    b = bytearray(ms.to_bytes(6, "big") + bytes((0x70 | (_seq >> 8), _seq & 0xFF)) + _take(8))
    b[8] = 0x80 | (b[8] & 0x3F)
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
