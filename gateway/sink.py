"""Where the gateway's events go. The request path only ever calls ``emit``, which must not block."""

from __future__ import annotations

from typing import Protocol

from contracts.events import Event


class EventSink(Protocol):
    """Accepts events without blocking the caller; delivery happens in the background.

    Implementations: ``gateway.kafka_sink.KafkaSink`` (Kafka, through a durable local
    write-ahead spool that no network wait holds up) and ``liftgate.direct_sink.DirectSink`` (embedded
    default: batched in-process writes through analytics' ingest function; it lives in
    the composition root because the gateway never imports analytics).
    """

    def emit(self, event: Event) -> None:
        """Queue one event; never raises because of the downstream, never waits on I/O."""

    async def start(self) -> None:
        """Begin background delivery (called in the app's lifespan)."""

    async def close(self) -> None:
        """Flush what can be flushed within a bounded time, persist the rest, stop."""

    def healthy(self) -> bool:
        """True while no event is being lost: delivered, or written to the spool (used by /readyz).

        Whether the downstream is reachable right now is reported separately in ``stats()``
        (``live``), so a Kafka outage does not take every gateway out of its load balancer.
        """

    def stats(self) -> dict[str, int]:
        """Counters for /readyz and metrics: e.g. queued, spooled, delivered, dropped."""
