"""The sink's Kafka transport says why a batch did not land, not just how much of it did."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.kafka_transport import BusTransport


class HalfProducer:
    """Acknowledges the first half of every batch; the rest fails for a stated reason."""

    send_failure: str | None = None

    def send(self, records: Sequence[tuple[str, bytes | None, bytes]], timeout_s: float) -> int:
        acked = len(records) // 2
        self.send_failure = f"{records[acked][0]}: Local: Message timed out" if acked < len(records) else None
        return acked

    def close(self, timeout_s: float = 0.0) -> bool:
        return True


def test_a_short_batch_is_logged_with_the_first_failed_records_topic_and_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = BusTransport(HalfProducer())  # type: ignore[arg-type]  # only send/close are used
    records = [("liftgate.interactions", b"u", b"1"), ("liftgate.judgements", b"u", b"2")]
    assert transport.deliver(records, 5.0) == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == "kafka sink: 1 of 2 events acknowledged (liftgate.judgements: Local: Message timed out)"
