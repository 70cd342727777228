"""The delivery thread's connection to Kafka: a batch of spooled records in, how many landed out.

Built on an :mod:`eventbus` producer (either backend): ``Producer.send`` queues the batch in
order, flushes it once, and answers the length of the prefix that was acknowledged — records
after a failure are sent again, so a unit's order never inverts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eventbus import Producer
from gateway.spool import Record

log = logging.getLogger(__name__)


class BusTransport:
    """``gateway.delivery.Transport`` over a connected producer whose topics exist."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def deliver(self, records: Sequence[Record], timeout_s: float) -> int:
        """Send and flush ``records``; return how many, from the start, were acknowledged."""
        acked = self._producer.send(records, timeout_s)
        if acked < len(records):
            why = self._producer.send_failure or "unknown"
            log.warning("kafka sink: %s of %s events acknowledged (%s)", acked, len(records), why)
        return acked

    def close(self, timeout_s: float = 0.0) -> bool:
        return self._producer.close(timeout_s)
