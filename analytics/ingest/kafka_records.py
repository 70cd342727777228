"""A faster record parser for kafka-python's consumer (message format v2).

kafka-python parses every record of a fetched batch in pure Python through several
layers (``DefaultRecordBatch._read_msg`` → ``DefaultRecord`` → properties →
``ConsumerRecord``): ~25 µs per record on this project's 2-core reference machine, the
largest single cost of the analytics consumer (bench/ingest/README.md). This module
replaces only the per-record loop of ``Fetcher.PartitionRecords._unpack_records`` with a
flat loop over the (decompressed) batch buffer that decodes the record fields with the
one-byte varint case inlined and yields the same ``ConsumerRecord`` tuples — in C
(``analytics/ingest/_kafkarec.c``) when that extension is built, else in Python below.

Everything around the loop keeps kafka-python's behaviour: batch CRC check
(``check_crcs``), transactional/aborted batches, control batches, the lazy generator (a
poll that takes fewer records than a batch holds stops mid-batch) and
``next_fetch_offset``. Anything the fast loop does not handle — message format v0/v1,
key/value deserializers — goes through kafka-python's own iteration. A structurally
invalid record raises kafka-python's ``CorruptRecordError``, as the original does.

``install()`` patches the class once per process, only for kafka-python versions whose
``PartitionRecords`` has the attributes used here (checked, else it is a no-op and the
consumer runs on kafka-python's parser); ``uninstall()`` restores it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import kafka
from kafka import errors as kafka_errors
from kafka.consumer import fetcher as kafka_fetcher
from kafka.record.util import decode_varint

try:  # the same loop in C, built by `pip install` (setup.py)
    from analytics.ingest import _kafkarec
except ImportError:  # no C compiler at install time: the Python loop below
    _kafkarec = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Whether the C loop (``analytics.ingest._kafkarec``) is used when built (tests compare both).
USE_C_PARSER = True

_PartitionRecords: Any = getattr(kafka_fetcher.Fetcher, "PartitionRecords", None)
_ORIGINAL: Any = getattr(_PartitionRecords, "_unpack_records", None)
_ConsumerRecord: Any = kafka_fetcher.ConsumerRecord
_CorruptRecordError: Any = kafka_errors.CorruptRecordError
_IsolationLevel: Any = getattr(kafka_fetcher, "IsolationLevel", None)


def _records_v2(self: Any, tp: Any, batch: Any) -> Iterator[Any]:
    """The records of one v2 data batch, as kafka-python's loop yields them."""
    batch._maybe_uncompress()
    buf = bytes(batch._buffer)
    pos = batch._pos
    base_offset = batch.base_offset
    ts_type = batch.timestamp_type
    first_ts = batch.first_timestamp
    max_ts = batch.max_timestamp
    append_time = ts_type == 1
    topic, partition, epoch = tp.topic, tp.partition, self.leader_epoch
    if _kafkarec is not None and USE_C_PARSER:
        records, nbytes, error = _kafkarec.records_v2(
            buf, pos, batch._num_records, base_offset, first_ts, max_ts, ts_type, topic, partition, epoch,
            _ConsumerRecord,
        )  # fmt: skip
        # Counted once per batch (kafka-python's fetch metrics read them when the batch is drained).
        self.records_read += len(records)
        self.bytes_read += nbytes
        for rec in records:
            self.next_fetch_offset = rec[3] + 1  # the offset
            yield rec
        if error is not None:
            raise _CorruptRecordError(f"Found invalid record structure: {error}")
        return
    dv = decode_varint
    crec = _ConsumerRecord
    new = tuple.__new__  # ConsumerRecord(...) goes through a Python-level __new__
    try:
        for _ in range(batch._num_records):
            # Record: length varint, attributes int8, timestampDelta varlong, offsetDelta
            # varint, key (varint length, -1 = null), value (same), headers (varint count,
            # then key string + nullable value each). Zigzag varints; the one- and two-byte
            # cases are inlined (a function call per field was most of the cost).
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = dv(buf, pos)
            start = pos
            pos += 1  # attributes (unused by the protocol for records)
            b = buf[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                ts_delta, pos = dv(buf, pos)
            b = buf[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                off_delta, pos = dv(buf, pos)
            b = buf[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                key_len = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                key_len, pos = dv(buf, pos)
            if key_len >= 0:
                key: bytes | None = buf[pos : pos + key_len]
                pos += key_len
            else:
                key = None
            b = buf[pos]
            if b < 0x80:
                value_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                value_len = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                value_len, pos = dv(buf, pos)
            if value_len >= 0:
                value: bytes | None = buf[pos : pos + value_len]
                pos += value_len
            else:
                value = None
            b = buf[pos]
            if b == 0:
                pos += 1
                headers: list[tuple[str, bytes | None]] = []
                header_size = -1
            else:
                count, pos = dv(buf, pos)
                if count < 0:
                    raise _CorruptRecordError(f"Found invalid number of record headers {count}")
                headers = []
                header_size = 0
                for _h in range(count):
                    hk_len, pos = dv(buf, pos)
                    if hk_len < 0:
                        raise _CorruptRecordError(f"Invalid negative header key size {hk_len}")
                    h_key = buf[pos : pos + hk_len].decode("utf-8")
                    pos += hk_len
                    hv_len, pos = dv(buf, pos)
                    if hv_len >= 0:
                        h_value: bytes | None = buf[pos : pos + hv_len]
                        pos += hv_len
                        header_size += hk_len + hv_len
                    else:
                        h_value = None
                        header_size += hk_len
                    headers.append((h_key, h_value))
            if pos - start != length or pos > len(buf):
                raise _CorruptRecordError(
                    f"Invalid record size: expected to read {length} bytes in record payload,"
                    f" but instead read {pos - start}"
                )
            offset = base_offset + off_delta
            self.records_read += 1
            self.bytes_read += length
            self.next_fetch_offset = offset + 1
            yield new(
                crec,
                (
                    topic,
                    partition,
                    epoch,
                    offset,
                    max_ts if append_time else first_ts + ts_delta,
                    ts_type,
                    key,
                    value,
                    headers,
                    None,
                    -1 if key is None else len(key),
                    -1 if value is None else len(value),
                    header_size,
                ),
            )
    except (IndexError, ValueError) as exc:
        raise _CorruptRecordError(f"Found invalid record structure: {exc!r}") from None
    if pos != len(buf):
        raise _CorruptRecordError(f"{len(buf) - pos} unconsumed bytes after all records consumed")


def _unpack_records(self: Any, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any) -> Any:
    """kafka-python's ``PartitionRecords._unpack_records`` with the fast per-record loop."""
    if key_deserializer is not None or value_deserializer is not None:
        yield from _ORIGINAL(self, tp, records, key_deserializer, value_deserializer)
        return
    try:
        batch = records.next_batch()
        last_batch = None
        while batch is not None:
            last_batch = batch
            if self.check_crcs and not batch.validate_crc():
                raise _CorruptRecordError(
                    f"Record batch for partition {self.topic_partition} at offset {batch.base_offset}"
                    " failed crc check"
                )
            if batch.magic == 2:
                self.leader_epoch = batch.leader_epoch
                if self.isolation_level == _IsolationLevel.READ_COMMITTED and batch.has_producer_id():
                    self._consume_aborted_transactions_up_to(batch.last_offset)
                    producer_id = batch.producer_id
                    if self._contains_abort_marker(batch):
                        self.aborted_producer_ids.discard(producer_id)
                    elif self._is_batch_aborted(batch):
                        self.next_fetch_offset = batch.next_offset
                        batch = records.next_batch()
                        continue
                if batch.is_control_batch:
                    self.next_fetch_offset = batch.next_offset
                    batch = records.next_batch()
                    continue
                yield from _records_v2(self, tp, batch)
            else:  # message format v0/v1: kafka-python's own record iteration
                for record in batch:
                    if self.check_crcs and not record.validate_crc():
                        raise _CorruptRecordError(
                            f"Record for partition {self.topic_partition} at offset {record.offset}"
                            " failed crc check"
                        )
                    key, value = record.key, record.value
                    self.records_read += 1
                    self.bytes_read += record.size_in_bytes
                    self.next_fetch_offset = record.offset + 1
                    yield _ConsumerRecord(
                        tp.topic,
                        tp.partition,
                        self.leader_epoch,
                        record.offset,
                        record.timestamp,
                        record.timestamp_type,
                        key,
                        value,
                        record.headers,
                        record.checksum,
                        len(key) if key is not None else -1,
                        len(value) if value is not None else -1,
                        -1,
                    )
            batch = records.next_batch()
        else:
            # v2 keeps the last offset of a batch even when compaction removed its last
            # record: continue after it (kafka-python does the same).
            if last_batch is not None and last_batch.magic == 2:
                self.next_fetch_offset = last_batch.next_offset
            self.drain()
    except StopIteration:
        raise RuntimeError("StopIteration raised unpacking messageset") from None


_REQUIRED = (
    "_unpack_records",
    "_consume_aborted_transactions_up_to",
    "_contains_abort_marker",
    "_is_batch_aborted",
    "drain",
)


def supported() -> bool:
    """Whether this kafka-python has the structure the fast parser was written against."""
    if _PartitionRecords is None or _IsolationLevel is None:
        return False
    if not all(hasattr(_PartitionRecords, a) for a in _REQUIRED):
        return False
    major = int(str(kafka.__version__).split(".", 1)[0])
    return major in (2, 3)


def install() -> bool:
    """Use the fast parser in this process; returns whether it is in use."""
    if not supported():
        log.warning("kafka-python %s: fast record parser not installed", kafka.__version__)
        return False
    _PartitionRecords._unpack_records = _unpack_records
    return True


def uninstall() -> None:
    if _PartitionRecords is not None and _ORIGINAL is not None:
        _PartitionRecords._unpack_records = _ORIGINAL


def installed() -> bool:
    return _PartitionRecords is not None and _PartitionRecords._unpack_records is _unpack_records
