"""Notification delivery settings (``LIFTGATE_NOTIFY_*``), built in the entry point."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from control.destinations import AddressPolicy


class NotifySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFTGATE_NOTIFY_", extra="ignore")

    # Run the delivery worker inside the analytics service.
    worker: bool = True
    # How often the worker looks for due deliveries when it has nothing to do.
    poll_s: float = Field(default=0.5, gt=0, le=60)
    # Attempts per delivery (the first one included), then it is marked failed.
    max_attempts: int = Field(default=8, ge=1, le=100)
    # Retry n waits min(backoff_max_s, backoff_base_s * 2**(n-1)), half of it jittered.
    backoff_base_s: float = Field(default=2.0, gt=0, le=3600)
    backoff_max_s: float = Field(default=600.0, gt=0, le=86_400)
    # One attempt's deadline (connect + send + response headers and body).
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    # Deliveries in flight at once (a slow receiver does not hold up the others).
    concurrency: int = Field(default=8, ge=1, le=256)
    # SSRF guard (control.destinations): link-local/metadata refused unless allowed;
    # loopback and private ranges allowed unless denied.
    allow_link_local: bool = False
    deny_private: bool = False

    def policy(self) -> AddressPolicy:
        return AddressPolicy(allow_link_local=self.allow_link_local, deny_private=self.deny_private)
