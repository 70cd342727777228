"""A durable local spool: the write-ahead log every gateway event passes through on its way to Kafka.

Layout of a spool directory (one per gateway process; an exclusive ``flock`` enforces it)::

    00000000000000000000.seg   append-only segments, named by their first global byte position
    committed                  global position up to which records were delivered, and its CRC
    lock

A record is ``<u32 length><u32 crc32>`` followed by ``length`` bytes of body, the body being
``<u16 topic length><u16 key length>`` + topic + key + value. ``append`` writes a batch with
one ``write`` and no fsync: once it returns, the records survive the process being killed (the
kernel's page cache keeps them). :meth:`Spool.sync` (the sink calls it from its own thread,
every ``fsync_interval_s``) makes records not yet delivered survive a power loss too. After a
crash the tail of the last segment may be torn: on open every pending record is checked, and
the first bad one ends its segment (logged, counted, the torn bytes truncated away so later
appends stay readable).

Threads: one writer (``append``), one reader (``read``/``seek``/``rewind``/``commit``) and one
syncer (``sync``) may use a Spool at once; a lock keeps the segment table consistent. A
segment is deleted once everything in it was committed — the one being written once it
holds ``roll_bytes`` (the next append starts a fresh one) or when the spool is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

Record = tuple[str, bytes, bytes]  # topic, key, value
_HEADER = struct.Struct("<II")
_BODY = struct.Struct("<HH")
_SUFFIX = ".seg"
MAX_SLOTS = 64


class SpoolLockedError(RuntimeError):
    """Another live process owns this spool directory."""


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
    """Append-only, CRC-checked segments with a committed read position."""

    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20, roll_bytes: int = 1 << 20) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        # A delivered segment still being written is kept (and appended to) until it holds this
        # much: a file created and deleted per delivered batch cost more CPU than the rest of
        # the spool's work.
        self.roll_bytes = min(roll_bytes, segment_bytes)
        self.corrupt_records = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(directory / "lock", "a+b")  # noqa: SIM115 - held for the spool's lifetime
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise SpoolLockedError(f"spool {directory} is in use by another process") from None
        self._lock = threading.Lock()
        self._committed_fd: int | None = None
        self._committed = self._read_committed()
        # base -> valid length; a segment's valid length may be shorter than the file after a crash
        self._segments: dict[int, int] = {}
        self.pending_records = 0
        self._recover()
        self._cursor = self._committed
        self._fd: int | None = None  # the segment being appended to (O_APPEND), owned by the writer
        self._fd_base = -1
        self._topics: dict[str, bytes] = {}  # topic -> its UTF-8 bytes (a handful of topics)
        # Recovered records may only be in the page cache (the previous process was killed):
        # the first sync writes them out.
        self._synced = self._committed
        self._dir_dirty = True

    # --- state ---------------------------------------------------------------------------

    @property
    def end(self) -> int:
        """The position after the last appended record."""
        base = max(self._segments)
        return base + self._segments[base]

    def appended(self) -> int:
        """:attr:`end`, read under the lock ``append`` holds while it calls ``on_appended``."""
        with self._lock:
            return self.end

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def cursor(self) -> int:
        """Where the next ``read`` starts."""
        return self._cursor

    @property
    def pending_bytes(self) -> int:
        return self.end - self._committed

    def empty(self) -> bool:
        return self.end <= self._committed

    def _path(self, base: int) -> Path:
        return self.directory / f"{base:020d}{_SUFFIX}"

    def _read_committed(self) -> int:
        try:
            fields = (self.directory / "committed").read_bytes().split()
        except FileNotFoundError:
            return 0
        try:
            if len(fields) == 1:  # written by earlier versions: the position alone
                return int(fields[0])
            if len(fields) == 2 and int(fields[1], 16) == zlib.crc32(fields[0]):
                return int(fields[0])
        except ValueError:
            pass
        if fields:
            # Sent again from the start: duplicates, which consumers drop, rather than a gap.
            log.warning(
                "spool %s: unreadable committed file; replaying from the oldest segment", self.directory
            )
        return 0

    def _write_committed(self, position: int) -> None:
        # Overwritten in place (a file rewritten and renamed cost ~100x more CPU per commit);
        # the CRC catches a torn write, read as "replay everything", never as a skipped gap.
        # No fsync: a position lost to a power cut only means records sent again.
        if self._committed_fd is None:
            self._committed_fd = os.open(self.directory / "committed", os.O_RDWR | os.O_CREAT, 0o644)
        digits = b"%020d" % position
        os.pwrite(self._committed_fd, b"%s %08x\n" % (digits, zlib.crc32(digits)), 0)

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

    def append(
        self, records: Sequence[Record], on_appended: Callable[[int, list[int]], None] | None = None
    ) -> tuple[int, list[int]]:
        """Write records with one ``write`` (no fsync); return their start and each one's end position.

        ``on_appended(start, ends)`` is called under the spool's lock, once the records are
        part of it: a reader that took :meth:`appended` before looking at what was handed to it
        this way finds every record up to that end there (or never handed over).

        On an I/O error (e.g. a full disk) nothing of the batch is kept and the error is raised:
        the caller still has the records and may try again.
        """
        if not records:
            return self.end, []
        # Each value is copied once (by the join); the CRC runs over the body in two parts.
        parts: list[bytes] = []
        offsets: list[int] = []
        pos = 0
        topics, head_pack, body_pack, crc32 = self._topics, _HEADER.pack, _BODY.pack, zlib.crc32
        for i, (topic, key, value) in enumerate(records, 1):
            t = topics.get(topic)
            if t is None:
                t = topics[topic] = topic.encode()
            head = body_pack(len(t), len(key)) + t + key
            size = len(head) + len(value)
            parts += (head_pack(size, crc32(value, crc32(head))), head, value)
            pos += _HEADER.size + size
            offsets.append(pos)
            if not i % 256:
                time.sleep(0)  # let other threads (the gateway's event loop) take the GIL
        data = b"".join(parts)
        with self._lock:
            base = max(self._segments)
            length = self._segments[base]
            if length >= self.segment_bytes:
                base, length = base + length, 0
                self._segments[base] = 0
            if self._fd is None or self._fd_base != base:
                self._close_fd()
                self._fd = os.open(self._path(base), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._fd_base = base
                self._dir_dirty = True
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:
                # A partial write must not stay in front of the next append, which reopens the file.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, length)
                self._close_fd()
                raise
            start = base + length
            self._segments[base] = length + len(data)
            self.pending_records += len(records)
            ends = [start + o for o in offsets]
            if on_appended is not None:
                on_appended(start, ends)
        return start, ends

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_base = -1

    def sync(self, upto: int | None = None) -> bool:
        """fsync what was appended before ``upto`` (default: all) and is not committed yet.

        New segments' directory entries are fsynced too. Returns whether anything was written
        out. Committed records need no fsync: the downstream has them.
        """
        with self._lock:
            end = self.end if upto is None else min(upto, self.end)
            since = max(self._synced, self._committed)
            if since >= end:
                self._synced = max(self._synced, end)
                return False
            paths = [self._path(b) for b, n in self._segments.items() if b + n > since]
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # delivered and deleted meanwhile
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if dir_dirty:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        with self._lock:
            self._synced = max(self._synced, end)
        return True

    # --- reading -------------------------------------------------------------------------

    def read(
        self, max_records: int, max_bytes: int = 4 << 20, upto: int | None = None
    ) -> list[tuple[Record, int]]:
        """Up to ``max_records`` records after the read cursor, each with its end position;
        with ``upto`` (a record boundary, e.g. an earlier :meth:`appended`), none ending after it."""
        out: list[tuple[Record, int]] = []
        while len(out) < max_records:
            with self._lock:
                end = self.end if upto is None else min(self.end, upto)
                if self._cursor >= end:
                    break
                base = max(b for b in self._segments if b <= self._cursor)
                valid = min(self._segments[base], end - base)
                later = [b for b in self._segments if b > base]
            offset = self._cursor - base
            if offset >= valid:  # end of this segment (or of its valid part): go to the next
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

    def seek(self, position: int) -> None:
        """Continue reading at ``position`` (a record boundary, e.g. after records delivered from memory)."""
        self._cursor = position

    def rewind(self) -> None:
        """Read again from the committed position (after a failed delivery)."""
        self._cursor = self._committed

    def commit(self, position: int, records: int) -> None:
        """Mark everything before ``position`` (``records`` records) delivered; drop delivered segments."""
        if position <= self._committed:
            return
        self._write_committed(position)
        with self._lock:
            self._committed = position
            self._cursor = max(self._cursor, position)
            self.pending_records = max(self.pending_records - records, 0)
            newest = max(self._segments)
            # (A segment starting at ``position`` is not delivered: it is empty or being written.)
            gone = [b for b, n in self._segments.items() if b < position and b + n <= position]
            for base in gone:
                if base == newest:
                    if self._segments[base] < self.roll_bytes:
                        continue
                    if base == self._fd_base:
                        self._close_fd()
                    self._segments[position] = 0  # the next append starts a fresh segment here
                del self._segments[base]
                self._path(base).unlink(missing_ok=True)
            if self.empty():
                self.pending_records = 0

    def close(self) -> None:
        with self._lock:
            self._close_fd()
            if self.empty():  # everything delivered: leave no segment behind
                for base in self._segments:
                    self._path(base).unlink(missing_ok=True)
        if self._committed_fd is not None:
            os.close(self._committed_fd)
            self._committed_fd = None
        self._lock_file.close()


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
