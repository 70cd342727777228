"""``python -m analytics.rollout``: the rollout controller as its own process.

Reads ``LIFTGATE_DATABASE_URL``, ``LIFTGATE_ROLLOUT_TICK_S``, ``LIFTGATE_ROLLOUT_SRM_GRACE_S``
and ``LIFTGATE_ROLLOUT_METRICS_PORT``; stops on SIGTERM/SIGINT after the current look.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from prometheus_client import CollectorRegistry, start_http_server
from pydantic import ValidationError
from sqlalchemy import create_engine

from analytics.rollout.settings import RolloutSettings, make_controller
from contracts import redaction


def main() -> int:
    try:
        settings = RolloutSettings()
    except ValidationError as exc:
        sys.stderr.write(f"analytics.rollout: invalid settings: {exc}\n")
        return 2
    redaction.install(database_url=settings.database_url)  # before anything logs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    engine = create_engine(settings.database_url, pool_size=2, max_overflow=2, pool_pre_ping=True)
    registry = CollectorRegistry()
    if settings.rollout_metrics_port is not None:
        server, _ = start_http_server(settings.rollout_metrics_port, addr="127.0.0.1", registry=registry)
        logging.getLogger(__name__).info("metrics on 127.0.0.1:%s", server.server_port)
    controller = make_controller(engine, settings, registry)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        controller.run(stop, settings.rollout_tick_s)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
