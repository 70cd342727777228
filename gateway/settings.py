"""Gateway settings (environment prefix ``LIFTGATE_``), built once in the entry point."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_WEAK_TOKENS = frozenset({"changeme", "change-me", "admin", "secret", "token", "password", "liftgate"})
MIN_TOKEN_LENGTH = 16


class GatewaySettings(BaseSettings):
    """Everything the gateway process needs; passed explicitly to ``create_app``."""

    model_config = SettingsConfigDict(env_prefix="LIFTGATE_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:15432/liftgate"
    # Required: the admin API refuses to run with a missing, short or default token.
    admin_token: str = Field(min_length=MIN_TOKEN_LENGTH)
    kafka_bootstrap: str | None = None
    # Durable spool of the Kafka sink while the broker is unreachable (one claimed subdir per process).
    spool_dir: str = ".liftgate/spool"
    # fsync period of spooled events Kafka has not acknowledged: what a power loss may lose (0: each write).
    spool_fsync_interval_s: float = Field(default=1.0, ge=0, le=3600)
    refresh_interval_s: float = Field(default=0.5, gt=0, le=1.0)
    shadow_concurrency: int = Field(default=32, ge=1, le=10_000)
    shadow_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
    feedback_memory: int = Field(default=100_000, ge=0, le=10_000_000)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("admin_token")
    @classmethod
    def _refuse_weak_token(cls, value: str) -> str:
        if value.lower() in _WEAK_TOKENS or len(set(value)) < 6:
            raise ValueError("admin token is a default or trivially weak value; generate a random one")
        return value
