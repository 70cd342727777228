"""The connection settings both services read (the same ``LIFTGATE_`` variables, the same
bounds): each service's settings class derives from :class:`ConnectionSettings`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from serving.protocol import HEADER_TIMEOUT_S, LINGER_BYTES, LINGER_S, MiB


class ConnectionSettings(BaseSettings):
    """Read deadlines and the staged close (serving.protocol)."""

    # A request's line and headers must arrive within header_timeout_s of its first byte
    # (or of the connection's opening).
    header_timeout_s: float = Field(default=HEADER_TIMEOUT_S, gt=0, le=600)
    # Staged close of a connection refused while its client may still be sending (a body past
    # its limit, a refusal with `connection: close`, 431): the answer and a FIN go out, then
    # what the client still sends is read and dropped for up to linger_s / linger_bytes.
    # linger_s = 0: close at once (the kernel may then reset the connection, see serving.protocol).
    linger_s: float = Field(default=LINGER_S, ge=0, le=30)
    linger_bytes: int = Field(default=LINGER_BYTES, ge=0, le=1024 * MiB)
