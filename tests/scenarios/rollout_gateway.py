"""``python -m tests.scenarios.rollout_gateway``: the real gateway app with events ingested in-process.

Uses ``liftgate.direct_sink.DirectSink`` when it exists; until then a small batching sink
that calls analytics' real ingest function from a worker thread (what DirectSink does).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
from hashlib import blake2b

import uvicorn
from sqlalchemy import create_engine

from analytics.ingest.write import ingest
from contracts.events import Event, InteractionEvent
from gateway.app import GatewayApp, create_app
from gateway.server import uvicorn_options
from gateway.settings import GatewaySettings
from gateway.sink import EventSink

log = logging.getLogger(__name__)


class IngestSink:
    """Queues events and ingests them every 100 ms (never blocks the request path)."""

    def __init__(self, database_url: str) -> None:
        self.engine = create_engine(database_url, pool_size=2, max_overflow=0)
        self.queue: list[Event] = []
        self.delivered = 0
        self.task: asyncio.Task[None] | None = None

    def emit(self, event: Event) -> None:
        self.queue.append(event)

    async def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                await self._flush()
            except Exception as exc:
                log.warning("ingest failed: %s", exc)

    async def _flush(self) -> None:
        batch, self.queue = self.queue, []
        if batch:
            await asyncio.to_thread(ingest, self.engine, batch)
            self.delivered += len(batch)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self._flush()
        self.engine.dispose()

    def healthy(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"queued": len(self.queue), "delivered": self.delivered}


class LossySink:
    """Deliberately broken logging for the SRM scenario: on routes starting with ``prefix``,
    every event of half the candidate's units is lost before ingest."""

    def __init__(self, inner: EventSink, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def emit(self, event: Event) -> None:
        if (
            isinstance(event, InteractionEvent)
            and event.route.startswith(self.prefix)
            and event.variant == "candidate"
            and blake2b(event.unit_id.encode(), digest_size=2).digest()[0] < 128
        ):
            return
        self.inner.emit(event)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def healthy(self) -> bool:
        return self.inner.healthy()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()


def make_sink(settings: GatewaySettings) -> EventSink:
    sink: EventSink
    if importlib.util.find_spec("liftgate.direct_sink") is not None:
        from liftgate.gateway_direct import make_direct_sink

        sink = make_direct_sink(settings)
    else:
        sink = IngestSink(settings.database_url)
    prefix = os.environ.get("SCENARIO_LOSSY_ROUTE_PREFIX")
    return LossySink(sink, prefix) if prefix else sink


def app_factory() -> GatewayApp:
    settings = GatewaySettings()
    logging.basicConfig(level="WARNING")
    return create_app(settings, make_sink(settings))


def main() -> None:
    settings = GatewaySettings()
    uvicorn.run(
        "tests.scenarios.rollout_gateway:app_factory",
        factory=True,
        host=settings.host,
        port=settings.port,
        **{**uvicorn_options(settings), "log_level": "warning"},
    )


if __name__ == "__main__":
    main()
