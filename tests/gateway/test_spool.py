"""The durable spool keeps records in order across restarts and survives torn writes."""

from __future__ import annotations

import logging
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from gateway.spool import Record, Spool, SpoolLockedError, claim_spool_dir


def records(n: int, start: int = 0) -> list[Record]:
    return [
        ("liftgate.interactions", f"unit-{i % 7}".encode(), f"event-{i}".encode() * 3)
        for i in range(start, start + n)
    ]


def read_all(spool: Spool) -> list[Record]:
    out: list[Record] = []
    for _ in range(10_000):
        batch = spool.read(100, max_bytes=4096)
        if not batch:
            return out
        out.extend(r for r, _ in batch)
    raise AssertionError("spool read did not end")


def test_records_come_back_in_order_across_segment_rotation(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1000)
    for i in range(10):
        spool.append(records(50, start=i * 50))
    assert len(list(tmp_path.glob("*.seg"))) > 5
    assert spool.pending_records == 500
    assert read_all(spool) == records(500)
    spool.close()


def test_a_read_up_to_a_position_stops_there_even_with_later_segments_written(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1000)
    _, ends = spool.append(records(5))
    seen: list[int] = []
    spool.append(records(20, start=5))  # fills the first segment (over 1000 bytes)
    spool.append(records(30, start=25), lambda start, e: seen.append(start))  # a later segment
    assert len(list(tmp_path.glob("*.seg"))) == 2 and seen and seen[0] > ends[-1]
    upto = ends[-1]  # within the first segment, which holds more after it
    assert [r for r, _ in spool.read(100, upto=upto)] == records(5)
    assert spool.cursor == upto and spool.read(100, upto=upto) == []
    assert read_all(spool) == records(50, start=5)  # nothing skipped after the bound
    spool.close()


def test_committed_records_are_not_replayed_after_reopening(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=2000)
    spool.append(records(300))
    batch = spool.read(120)
    spool.commit(batch[-1][1], len(batch))
    spool.close()
    reopened = Spool(tmp_path, segment_bytes=2000)
    assert reopened.pending_records == 180
    assert read_all(reopened) == records(180, start=120)
    reopened.close()


def test_fully_delivered_segments_are_deleted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=1000)
    spool.append(records(200))
    batch = spool.read(1000, max_bytes=1 << 20)
    assert len(batch) == 200
    spool.commit(batch[-1][1], len(batch))
    assert spool.empty() and spool.pending_bytes == 0 and spool.pending_records == 0
    assert list(tmp_path.glob("*.seg")) == []
    spool.append(records(3, start=900))  # appending after a full drain starts a fresh segment
    assert read_all(spool) == records(3, start=900)
    spool.close()


def test_a_failed_delivery_rewinds_to_the_committed_position(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(10))
    first = spool.read(4)
    spool.commit(first[-1][1], 4)
    spool.read(4)
    spool.rewind()
    assert read_all(spool) == records(6, start=4)
    spool.close()


def test_a_torn_tail_is_skipped_logged_and_later_appends_stay_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.append(records(20))
    spool.close()
    segment = next(tmp_path.glob("*.seg"))
    whole = segment.read_bytes()
    segment.write_bytes(whole + whole[:25])  # a crash in the middle of writing a record
    with caplog.at_level(logging.WARNING, logger="gateway.spool"):
        reopened = Spool(tmp_path)
    assert "torn" in caplog.text
    assert reopened.corrupt_records == 1 and reopened.pending_records == 20
    reopened.append(records(5, start=100))
    assert read_all(reopened) == records(20) + records(5, start=100)
    reopened.close()


def test_a_corrupt_record_ends_its_segment_but_not_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(10))
    spool.close()
    segment = next(tmp_path.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    record_size = len(data) // 10
    data[record_size * 6 + 12] ^= 0xFF  # flip a byte inside the 7th record: its CRC fails
    segment.write_bytes(bytes(data))
    reopened = Spool(tmp_path)
    assert reopened.corrupt_records == 1
    assert read_all(reopened) == records(6)
    reopened.close()


def test_one_spool_directory_has_one_owner_and_claim_finds_a_free_slot(tmp_path: Path) -> None:
    first = claim_spool_dir(tmp_path)
    with pytest.raises(SpoolLockedError):
        Spool(first.directory)
    second = claim_spool_dir(tmp_path)
    assert (first.directory.name, second.directory.name) == ("0", "1")
    first.close()
    third = claim_spool_dir(tmp_path)
    assert third.directory.name == "0"  # a dead owner's slot is reused
    second.close()
    third.close()


def test_a_failed_write_keeps_nothing_of_its_batch_and_later_appends_stay_readable(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=500)
    spool.append(records(20))  # over 500 bytes: the next append starts a segment at spool.end
    next_segment = tmp_path / f"{spool.end:020d}.seg"
    next_segment.symlink_to("/dev/full")  # every write to it fails with ENOSPC
    with pytest.raises(OSError):
        spool.append(records(5, start=20))
    assert spool.pending_records == 20
    next_segment.unlink()
    spool.append(records(5, start=20))  # the caller retries the same batch
    assert read_all(spool) == records(25)
    spool.close()
    reopened = Spool(tmp_path, segment_bytes=500)
    assert reopened.corrupt_records == 0 and read_all(reopened) == records(25)
    reopened.close()


def test_sync_writes_out_only_records_not_yet_committed(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.sync() is False  # nothing appended
    spool.append(records(10))
    assert spool.sync() is True
    assert spool.sync() is False  # already on disk
    spool.append(records(10, start=10))
    batch = spool.read(100)
    spool.commit(batch[-1][1], len(batch))
    assert spool.sync() is False  # delivered: nothing a power loss could take
    spool.close()


def test_a_writer_and_a_reader_in_two_threads_see_every_record_once_and_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=2_000)
    written = records(3_000)
    got: list[Record] = []

    def write() -> None:
        for i in range(0, len(written), 30):
            spool.append(written[i : i + 30])
            time.sleep(0)

    def read() -> None:
        deadline = time.monotonic() + 30
        while len(got) < len(written) and time.monotonic() < deadline:
            batch = spool.read(70, max_bytes=1_500)
            if batch:
                got.extend(r for r, _ in batch)
                spool.commit(batch[-1][1], len(batch))
            spool.sync()

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == written
    assert spool.empty() and spool.pending_records == 0
    assert len(list(tmp_path.glob("*.seg"))) <= 1  # delivered segments were deleted as they went
    spool.close()


def test_a_spool_in_the_documented_format_is_read_back_and_appended_to_alike(tmp_path: Path) -> None:
    # <u32 length><u32 crc32> + body, body = <u16 topic length><u16 key length> topic key value:
    # what earlier versions wrote, so a spool left by an upgraded gateway is replayed.
    def frame(topic: str, key: bytes, value: bytes) -> bytes:
        body = struct.pack("<HH", len(topic.encode()), len(key)) + topic.encode() + key + value
        return struct.pack("<II", len(body), zlib.crc32(body)) + body

    (tmp_path / f"{0:020d}.seg").write_bytes(b"".join(frame(*r) for r in records(3)))
    spool = Spool(tmp_path)
    assert spool.pending_records == 3 and spool.corrupt_records == 0
    spool.append(records(2, start=3))
    assert read_all(spool) == records(5)
    assert (tmp_path / f"{0:020d}.seg").read_bytes() == b"".join(frame(*r) for r in records(5))
    spool.close()


def test_a_committed_position_in_the_earlier_plain_format_is_honoured(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(10))
    batch = spool.read(4)
    spool.close()
    (tmp_path / "committed").write_text(str(batch[-1][1]))  # how earlier versions wrote it
    reopened = Spool(tmp_path)
    assert read_all(reopened) == records(6, start=4)
    reopened.close()


def test_a_damaged_committed_position_replays_everything_rather_than_skipping(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.append(records(10))
    batch = spool.read(4)
    spool.commit(batch[-1][1], 4)
    spool.close()
    committed = tmp_path / "committed"
    text = committed.read_bytes()
    committed.write_bytes(text[:15] + b"9" + text[16:])  # a torn write: a larger position
    with caplog.at_level(logging.WARNING, logger="gateway.spool"):
        reopened = Spool(tmp_path)
    assert "unreadable committed file" in caplog.text
    assert read_all(reopened) == records(10)  # resent (consumers dedup), none skipped
    reopened.close()


def test_a_delivered_segment_is_appended_to_until_it_reaches_roll_size_and_removed_on_close(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, roll_bytes=10_000)
    spool.append(records(10))
    batch = spool.read(100)
    spool.commit(batch[-1][1], len(batch))
    assert spool.empty() and len(list(tmp_path.glob("*.seg"))) == 1  # small: kept
    spool.append(records(5, start=10))
    assert len(list(tmp_path.glob("*.seg"))) == 1 and read_all(spool) == records(5, start=10)
    spool.commit(spool.end, 5)
    spool.close()
    assert list(tmp_path.glob("*.seg")) == []  # everything delivered: nothing left behind
    reopened = Spool(tmp_path)
    assert reopened.empty() and read_all(reopened) == []
    reopened.close()


def test_sync_up_to_a_position_leaves_later_records_for_the_next_sync(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first, _ = spool.append(records(5))
    middle = spool.end
    spool.append(records(5, start=5))
    assert first == 0 and spool.sync(middle) is True
    assert spool.sync(middle) is False  # up to there it is on disk
    assert spool.sync() is True  # the rest
    spool.close()
