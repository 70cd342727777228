"""A durable local spool: where events wait, in order, while Kafka is unreachable.

Layout of a spool directory (one per gateway process; an exclusive ``flock`` enforces it)::

    00000000000000000000.seg   append-only segments, named by their first global byte position
    committed                  global position up to which records were delivered (atomic rename)
    lock

A record is ``<u32 length><u32 crc32>`` followed by ``length`` bytes of body, the body being
``<u16 topic length><u16 key length>`` + topic + key + value. Appends are written and
fsynced per batch, so an acknowledged ``append`` survives a crash. After a crash the tail
of the last segment may be torn: on open every pending record is checked, and the first
bad one ends its segment (logged, counted, the torn bytes truncated away so later appends
stay readable). Only one thread uses a Spool; it is not thread-safe by design.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

Record = tuple[str, bytes, bytes]  # topic, key, value
_HEADER = struct.Struct("<II")
_BODY = struct.Struct("<HH")
_SUFFIX = ".seg"
MAX_SLOTS = 64


class SpoolLockedError(RuntimeError):
    """Another live process owns this spool directory."""


def _encode(record: Record) -> bytes:
    topic, key, value = record
    t = topic.encode()
    body = _BODY.pack(len(t), len(key)) + t + key + value
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _parse(buf: bytes | memoryview, pos: int) -> tuple[Record, int] | None:
    """The record at ``pos`` and the position after it; None if incomplete or corrupt."""
    if len(buf) - pos < _HEADER.size:
        return None
    length, crc = _HEADER.unpack_from(buf, pos)
    start = pos + _HEADER.size
    end = start + length
    if length < _BODY.size or end > len(buf):
        return None
    body = bytes(buf[start:end])
    if zlib.crc32(body) != crc:
        return None
    t_len, k_len = _BODY.unpack_from(body, 0)
    k_start = _BODY.size + t_len
    if k_start + k_len > length:
        return None
    topic = body[_BODY.size : k_start].decode(errors="replace")
    return (topic, body[k_start : k_start + k_len], body[k_start + k_len :]), end


class Spool:
    """Append-only, CRC-checked, fsynced segments with a committed read position."""

    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20, fsync: bool = True) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.corrupt_records = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = open(directory / "lock", "a+b")  # noqa: SIM115 - held for the spool's lifetime
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise SpoolLockedError(f"spool {directory} is in use by another process") from None
        self._committed = self._read_committed()
        # base -> valid length; a segment's valid length may be shorter than the file after a crash
        self._segments: dict[int, int] = {}
        self.pending_records = 0
        self._recover()
        self._cursor = self._committed
        self._active: BinaryIO | None = None

    # --- state ---------------------------------------------------------------------------

    @property
    def end(self) -> int:
        base = max(self._segments)
        return base + self._segments[base]

    @property
    def pending_bytes(self) -> int:
        return self.end - self._committed

    def empty(self) -> bool:
        return self.end <= self._committed

    def _path(self, base: int) -> Path:
        return self.directory / f"{base:020d}{_SUFFIX}"

    def _read_committed(self) -> int:
        try:
            return int((self.directory / "committed").read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning(
                "spool %s: unreadable committed file; replaying from the oldest segment", self.directory
            )
            return 0

    def _recover(self) -> None:
        bases = sorted(int(p.name[: -len(_SUFFIX)]) for p in self.directory.glob(f"*{_SUFFIX}"))
        for i, base in enumerate(bases):
            path = self._path(base)
            size = path.stat().st_size
            last = i == len(bases) - 1
            if base + size <= self._committed:
                path.unlink()
                continue
            data = path.read_bytes()
            pos = max(self._committed - base, 0)
            count = 0
            while pos < size:
                parsed = _parse(data, pos)
                if parsed is None:
                    break
                pos, count = parsed[1], count + 1
            if pos < size:
                self.corrupt_records += 1
                log.warning(
                    "spool %s: corrupt or torn record at byte %s of %s; skipping its last %s bytes",
                    self.directory,
                    pos,
                    path.name,
                    size - pos,
                )
                if last:
                    with open(path, "r+b") as f:
                        f.truncate(pos)
            self._segments[base] = pos
            self.pending_records += count
        if not self._segments:
            self._segments[self._committed] = 0

    # --- writing -------------------------------------------------------------------------

    def append(self, records: Sequence[Record]) -> int:
        """Write records durably (one fsync); return the bytes written."""
        if not records:
            return 0
        parts = []
        for i, record in enumerate(records, 1):
            parts.append(_encode(record))
            if not i % 256:
                time.sleep(0)  # let other threads (the gateway's event loop) take the GIL
        data = b"".join(parts)
        base = max(self._segments)
        if self._segments[base] >= self.segment_bytes:
            self._close_active()
            base += self._segments[base]
            self._segments[base] = 0
        if self._active is None:
            self._active = open(self._path(base), "ab")  # noqa: SIM115 - kept open across appends
        self._active.write(data)
        self._active.flush()
        if self.fsync:
            os.fsync(self._active.fileno())
        self._segments[base] += len(data)
        self.pending_records += len(records)
        return len(data)

    def _close_active(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    # --- reading -------------------------------------------------------------------------

    def read(self, max_records: int, max_bytes: int = 4 << 20) -> list[tuple[Record, int]]:
        """Up to ``max_records`` records after the read cursor, each with its end position."""
        out: list[tuple[Record, int]] = []
        while len(out) < max_records and self._cursor < self.end:
            base = max(b for b in self._segments if b <= self._cursor)
            valid = self._segments[base]
            offset = self._cursor - base
            if offset >= valid:  # end of this segment (or of its valid part): go to the next
                later = [b for b in self._segments if b > base]
                if not later:
                    break
                self._cursor = min(later)
                continue
            with open(self._path(base), "rb") as f:
                f.seek(offset)
                buf = f.read(min(max(max_bytes, 1 << 16), valid - offset))
            pos = 0
            while len(out) < max_records:
                parsed = _parse(buf, pos)
                if parsed is None:
                    break
                record, pos = parsed
                out.append((record, base + offset + pos))
            if pos == 0:  # a record bigger than the read window: read it whole
                length = _HEADER.unpack_from(buf, 0)[0] + _HEADER.size
                with open(self._path(base), "rb") as f:
                    f.seek(offset)
                    parsed = _parse(f.read(length), 0)
                if parsed is None:
                    raise RuntimeError(f"spool {self.directory}: unreadable record at {self._cursor}")
                out.append((parsed[0], self._cursor + parsed[1]))
                pos = parsed[1]
            self._cursor = base + offset + pos
            if len(buf) >= max_bytes:
                break
        return out

    def rewind(self) -> None:
        """Read again from the committed position (after a failed delivery)."""
        self._cursor = self._committed

    def commit(self, position: int, records: int) -> None:
        """Mark everything before ``position`` (``records`` records) delivered; drop old segments."""
        if position <= self._committed:
            return
        tmp = self.directory / "committed.tmp"
        with open(tmp, "w") as f:
            f.write(str(position))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / "committed")
        self._committed = position
        self._cursor = max(self._cursor, position)
        self.pending_records = max(self.pending_records - records, 0)
        newest = max(self._segments)
        for base in sorted(self._segments):
            if base + self._segments[base] <= position and (base != newest or self.empty()):
                if base == newest:
                    self._close_active()
                    del self._segments[base]
                    self._segments[position] = 0  # the next append starts a fresh segment here
                else:
                    del self._segments[base]
                self._path(base).unlink(missing_ok=True)
        if self.empty():
            self.pending_records = 0

    def close(self) -> None:
        self._close_active()
        self._lock.close()


def claim_spool_dir(root: Path, slots: int = MAX_SLOTS, *, segment_bytes: int = 64 << 20) -> Spool:
    """Open the first free spool slot under ``root`` (``root/0``, ``root/1``, ...).

    Each gateway worker needs its own spool; numbered slots let a restarted worker pick up
    (and replay) a slot a dead worker left behind, whatever its pid.
    """
    for slot in range(slots):
        try:
            return Spool(root / str(slot), segment_bytes=segment_bytes)
        except SpoolLockedError:
            continue
    raise SpoolLockedError(f"all {slots} spool slots under {root} are in use")
