"""``python -m liftgate.gateway_direct``: the gateway with the Direct sink (embedded default).

The gateway never imports analytics, so the composition root wires them: events go
straight from the gateway process into PostgreSQL through analytics' ingest function
(``liftgate.direct_sink.DirectSink``). With Kafka, run ``python -m gateway`` instead.
"""

from __future__ import annotations

import logging

import uvicorn

from contracts import redaction
from gateway.app import GatewayApp, create_app
from gateway.server import uvicorn_options
from gateway.settings import GatewaySettings
from gateway.sink import EventSink
from liftgate.direct_sink import DirectSink


def make_direct_sink(settings: GatewaySettings) -> EventSink:
    return DirectSink(settings.database_url)


def app_factory() -> GatewayApp:
    settings = GatewaySettings()
    redaction.install(
        settings.admin_token, settings.ngram_key, database_url=settings.database_url
    )  # before anything logs
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return create_app(settings, make_direct_sink(settings))


def main() -> None:
    settings = GatewaySettings()  # fails fast without an admin token
    # One worker: the Direct sink batches in this process (scale out with Kafka instead).
    uvicorn.run(
        "liftgate.gateway_direct:app_factory",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=1,
        **uvicorn_options(settings),
    )


if __name__ == "__main__":
    main()
