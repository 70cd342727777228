"""The delivery thread's connection to Kafka: a batch of spooled records in, how many landed out.

Built on an :mod:`eventbus` producer (either backend): every record is produced with a
delivery callback, the batch is flushed once, and the answer is the length of the prefix
that was acknowledged — records after a failure are sent again, so a unit's order never
inverts.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

from eventbus import BusError, Producer
from gateway.spool import Record

log = logging.getLogger(__name__)

# Release the GIL between short runs of records, so the gateway's event loop thread is not
# kept waiting for a whole batch (up to the 5 ms switch interval); a sleep(0) per 64 records
# is free (bench/gateway/sink_bench.py).
YIELD_EVERY = 64
_PENDING, _ACKED, _FAILED = 0, 1, 2


def _mark(outcomes: bytearray, i: int, error: BusError | None) -> None:
    outcomes[i] = _ACKED if error is None else _FAILED


class BusTransport:
    """``gateway.delivery.Transport`` over a connected producer whose topics exist."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def deliver(self, records: Sequence[Record], timeout_s: float) -> int:
        """Send and flush ``records``; return how many, from the start, were acknowledged."""
        outcomes = bytearray(len(records))
        produce = self._producer.produce
        try:
            for i, (topic, key, value) in enumerate(records):
                produce(topic, key, value, functools.partial(_mark, outcomes, i))
                if not (i + 1) % YIELD_EVERY:
                    time.sleep(0)
        except BusError as exc:
            log.warning("kafka sink: the client refused a record (%s)", exc)
        left = self._producer.flush(timeout_s)
        acked = len(outcomes) - len(outcomes.lstrip(b"\x01"))
        if acked < len(records):
            log.warning(
                "kafka sink: %s of %s events acknowledged (%s still pending)", acked, len(records), left
            )
        return acked

    def close(self, timeout_s: float = 0.0) -> bool:
        return self._producer.close(timeout_s)
