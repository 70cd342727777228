"""``python -m gateway``: uvicorn (uvloop + httptools, access log off, the read deadlines of
``gateway.server``), one or more workers.

Events go to Kafka (``gateway.kafka_sink.KafkaSink``) when ``LIFTGATE_KAFKA_BOOTSTRAP`` is set;
otherwise nowhere (``NullSink``) — ``liftgate up`` injects the Direct sink instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import tempfile
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from contracts import redaction
from eventbus import open_bus
from gateway.app import GatewayApp, create_app
from gateway.null_sink import NullSink
from gateway.server import uvicorn_options
from gateway.settings import GatewaySettings
from gateway.sink import EventSink

log = logging.getLogger("gateway")


def make_sink(settings: GatewaySettings) -> EventSink:
    if settings.kafka_bootstrap:
        try:
            module = importlib.import_module("gateway.kafka_sink")
        except ImportError:
            log.warning(
                "LIFTGATE_KAFKA_BOOTSTRAP is set but gateway.kafka_sink is not available; events are dropped"
            )
            return NullSink()
        # No ensure_topics here: the sink creates missing topics when it connects, and a
        # gateway must be able to start (and spool) while Kafka is down.
        config = module.SinkConfig(fsync_interval_s=settings.spool_fsync_interval_s)
        sink: EventSink = module.KafkaSink(
            settings.kafka_bootstrap,
            Path(settings.spool_dir),
            config=config,
            bus=open_bus(settings.kafka_client),
        )
        return sink
    log.warning("no LIFTGATE_KAFKA_BOOTSTRAP: events go nowhere (inject a sink, e.g. via `liftgate up`)")
    return NullSink()


def app_factory() -> GatewayApp:
    """Called in each worker process (uvicorn ``factory=True``)."""
    settings = GatewaySettings()
    # Before anything logs: no configured secret may reach a log line (upstream API keys are
    # added as the config snapshot loads them).
    redaction.install(settings.admin_token, settings.ngram_key, database_url=settings.database_url)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return create_app(settings, make_sink(settings))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    for name in ("host", "port", "workers", "log_level"):
        value = getattr(args, name)
        if value is not None:
            os.environ[f"LIFTGATE_{name.upper()}"] = str(value)
    try:
        settings = GatewaySettings()
    except ValidationError as exc:  # e.g. no LIFTGATE_ADMIN_TOKEN: refuse to start, say why
        reasons = "; ".join(
            f"LIFTGATE_{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise SystemExit(f"gateway: invalid settings: {reasons}") from None
    if settings.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="liftgate-prom-")
    uvicorn.run(
        "gateway.__main__:app_factory",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        **uvicorn_options(settings),
    )


if __name__ == "__main__":
    main()
