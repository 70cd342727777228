"""The analytics service's HTTP server: uvicorn with ``serving.protocol``'s read deadlines,
head limit and staged close, in the service's settings.

What is the service's own: its answers are JSON ``{"detail": reason}`` like every other
error of the service — also the protocol's 408 for a head not received in time (a silent
new connection included) and its 431. The request's body is timed and bounded by the
request guard (``analytics.service.guard``), which answers its own 408 and marks that
request :data:`~serving.protocol.CLOSE_AT_ONCE`. uvicorn's ``limit_concurrency`` bounds the
connections and tasks at once (beyond: 503).
"""

from __future__ import annotations

from typing import Any

import orjson
import uvicorn

from analytics.service.settings import AnalyticsSettings
from serving.protocol import ReadLimits, Refusals, ServingProtocol, protocol_class, refusal


def _refusal(status: bytes, detail: str) -> bytes:
    return refusal(status, orjson.dumps({"detail": detail}), b"application/json")


_TIMEOUT = _refusal(b"408 Request Timeout", "request head not received in time")
REFUSALS = Refusals(
    head_timeout=_TIMEOUT,
    first_request_timeout=_TIMEOUT,
    head_too_large=_refusal(b"431 Request Header Fields Too Large", "request head too large"),
)


def read_limits(settings: AnalyticsSettings) -> ReadLimits:
    return ReadLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=None,  # the request guard's
        max_header_bytes=settings.max_head_bytes,
        linger_s=settings.linger_s,
        linger_bytes=settings.linger_bytes,
    )


def protocol(limits: ReadLimits) -> type[ServingProtocol]:
    """The service's HTTP protocol class (uvicorn's ``http=``) serving with ``limits``."""
    return protocol_class(limits, REFUSALS, "AnalyticsProtocol")


def serve(app: Any, settings: AnalyticsSettings) -> None:
    """Run ``app`` until interrupted (uvicorn's signal handling)."""
    uvicorn.run(
        app,
        host=settings.analytics_host,
        port=settings.analytics_port,
        log_level=settings.log_level,
        access_log=False,
        http=protocol(read_limits(settings)),
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_connections,
        server_header=False,
    )
