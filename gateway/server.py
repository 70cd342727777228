"""How the gateway is served: uvicorn (uvloop + httptools) with ``serving.protocol``'s read
deadlines, header limit and staged close, in the gateway's settings.

What is the gateway's own: the request's body is timed by the protocol (``body_timeout_s``;
a body that does not arrive in time closes the connection and the application sees a
disconnect), and the protocol's own answers carry no body — a slowloris head gets a bare
408, a connection that never sends a first request is closed without a word, an oversized
head gets a bare 431. What the application refuses under ``/v1`` is answered in the OpenAI
error shape by the application. The limits travel with the application
(``GatewayApp.read_limits``): with ``--workers``, uvicorn starts each worker in a process of
its own and the application is built there from the settings.
"""

from __future__ import annotations

from typing import Any

from gateway.settings import GatewaySettings
from serving.protocol import ReadLimits, Refusals, ServingProtocol


def read_limits(settings: GatewaySettings) -> ReadLimits:
    return ReadLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        linger_s=settings.linger_s,
        linger_bytes=settings.linger_bytes,
    )


class GatewayProtocol(ServingProtocol):
    """The gateway's HTTP protocol: bare 408 and 431, nothing to a silent connection."""

    refusals = Refusals()
    # The settings' defaults: used only when the served application does not carry its own.
    limits = ReadLimits(body_timeout_s=GatewaySettings.model_fields["body_timeout_s"].default)


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """The uvicorn settings every entry point serves the gateway with (plus app/host/port)."""
    return {
        "loop": "uvloop",
        "http": GatewayProtocol,
        "access_log": False,
        "log_level": settings.log_level,
        "server_header": False,
        "proxy_headers": False,
        "date_header": False,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
    }
