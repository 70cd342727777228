"""The controller's settings and how it is built from them.

In the analytics service the controller is one of the background workers
(``analytics.service.app.controller_worker``); ``python -m analytics.rollout`` runs it alone (any
number of them may run: the per-experiment advisory lock keeps them from double-acting).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import Engine

from analytics.rollout.controller import Controller
from analytics.rollout.telemetry import for_registry


class RolloutSettings(BaseSettings):
    """``LIFTGATE_ROLLOUT_*``: how often the controller looks, and whether it runs at all."""

    model_config = SettingsConfigDict(env_prefix="LIFTGATE_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:15432/liftgate"
    # Run the controller inside the analytics service (turn off when it runs standalone).
    rollout_controller: bool = True
    # How often the controller wakes up; each plan's interval_s limits looks per experiment.
    rollout_tick_s: float = Field(default=2.0, gt=0, le=3600)
    # No SRM verdict in a stage's first seconds (too few units to say anything); the counts
    # are units the gateway tagged with the stage, all assigned with its weights.
    rollout_srm_grace_s: float = Field(default=2.0, ge=0, le=600)
    # Standalone only: serve /metrics on this port (0 = an ephemeral port, None = off).
    rollout_metrics_port: int | None = Field(default=None, ge=0, le=65535)


def make_controller(engine: Engine, settings: RolloutSettings, registry: object) -> Controller:
    from prometheus_client import CollectorRegistry

    assert isinstance(registry, CollectorRegistry)
    return Controller(engine, for_registry(registry), srm_grace_s=settings.rollout_srm_grace_s)
