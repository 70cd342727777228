"""Analytics service settings (environment prefix ``LIFTGATE_``), built once in the entry point."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from analytics.rollout.settings import RolloutSettings
from control.notify_settings import NotifySettings
from eventbus import ClientChoice
from serving.settings import ConnectionSettings

_WEAK_TOKENS = frozenset({"changeme", "change-me", "admin", "secret", "token", "password", "liftgate"})
MIN_TOKEN_LENGTH = 16


class AnalyticsSettings(ConnectionSettings):
    """Everything ``python -m analytics`` needs; passed explicitly to ``create_app``."""

    model_config = SettingsConfigDict(env_prefix="LIFTGATE_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:15432/liftgate"
    # Required: mutating endpoints are refused without a strong token, so is startup.
    admin_token: str = Field(min_length=MIN_TOKEN_LENGTH)
    # Reads (reports, metrics, rollouts, /docs, the dashboard): "token" needs the read token
    # or the admin token (bearer header, or the dashboard's session cookie); "open" lets
    # anyone read (e.g. behind an authenticating proxy). See analytics.service.access.
    read_access: Literal["token", "open"] = "token"
    read_token: str | None = Field(default=None, min_length=MIN_TOKEN_LENGTH)
    session_ttl_s: float = Field(default=7 * 86_400.0, gt=0, le=90 * 86_400.0)
    # Sign-in lockout: this many failures in a row lock the name (or, for tokens, the client
    # address) for login_lockout_s, even for the right password (analytics.service.login).
    login_max_failures: int = Field(default=5, ge=1, le=1000)
    login_lockout_s: float = Field(default=300.0, ge=1, le=86_400)
    # ?fresh=true (admin only) recomputes a report: at most once per experiment this often.
    fresh_min_interval_s: float = Field(default=5.0, ge=0, le=3600)
    # Limits of every request (analytics.service.guard, analytics.service.server; the head's
    # deadline and the staged close's linger_s/linger_bytes: serving.settings).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    body_timeout_s: float = Field(default=30.0, gt=0, le=600)
    keep_alive_s: int = Field(default=5, ge=1, le=600)
    max_head_bytes: int = Field(default=64 * 1024, ge=4096, le=1024 * 1024)
    max_connections: int = Field(default=512, ge=1, le=100_000)
    kafka_bootstrap: str | None = None
    # Kafka client library: confluent (librdkafka), python (kafka-python), auto (confluent when
    # it can be imported); see docs/operations.md ("Kafka client").
    kafka_client: ClientChoice = "auto"
    # Run the Kafka consumer inside the service when a bootstrap is set (turn off when the
    # consumers run as separate processes).
    analytics_consumer: bool = True
    analytics_host: str = "127.0.0.1"
    analytics_port: int = Field(default=8090, ge=0, le=65535)
    # Snapshotter: every running experiment is snapshotted this often (0 disables it).
    snapshot_interval_s: float = Field(default=30.0, ge=0, le=86_400)
    # Periodic snapshots older than this keep only their time-series points, except the
    # newest of each hour (0: keep every report body; they are tens of kB with segments).
    snapshot_keep_full_s: float = Field(default=86_400.0, ge=0)
    # Content retention job (curation.retention): clears stored text past its TTL and deletes
    # expired datasets this often (0 disables it).
    retention_interval_s: float = Field(default=3_600.0, ge=0, le=86_400)
    # rl_rollups compaction (analytics.ingest.rollups.compact_rl_rollups): ingest appends a
    # row per response and thumb; this often they are summed into one row per key (0: never,
    # the report's RL-risks section then reads every appended row).
    rl_compact_interval_s: float = Field(default=60.0, ge=0, le=86_400)
    # A report request is served from the latest snapshot when it is younger than this.
    report_max_age_s: float = Field(default=60.0, ge=0, le=86_400)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    # The report's RL-risk detectors read every primary response: a report reuses the latest
    # snapshot's rl_risks section while it is younger than this (0: computed in every report;
    # the rollout controller always computes its own). ``rl_risks: false`` leaves it out.
    rl_risks: bool = True
    rl_risks_max_age_s: float = Field(default=300.0, ge=0, le=86_400)
    # The judge the probe (POST .../rl-risks/probe) re-scores with: the gateway's variables,
    # so one environment configures both (unset: the probe answers 503).
    judge_url: str | None = None
    judge_model: str = "judge"
    judge_api_key: str | None = Field(default=None, repr=False)
    judge_score_min: float = 1.0
    judge_score_max: float = 10.0
    judge_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # Hashed n-grams (content logging ``hashed``): the gateway's key, so an operator's phrase
    # list resolves the stuffing table's hashes to text (unset: hashes only), and that list
    # (a text file, one phrase per line; ``?phrase=`` on the rl-risks API adds more).
    ngram_key: str | None = Field(default=None, repr=False)
    ngram_phrases: str | None = None
    # Bounds that keep a report cheap whatever the data: segments shown, snapshots in the
    # time series, and shadow pairs read for the paired comparison.
    max_segments: int = Field(default=12, ge=0, le=200)
    max_timeseries_points: int = Field(default=200, ge=2, le=5000)
    max_pairs: int = Field(default=20_000, ge=100, le=1_000_000)
    paired_window_s: float = Field(default=86_400.0, gt=0)
    # The rollout controller's SRM grace after a stage change (``RolloutSettings`` reads the
    # same variable): a rollout report's live look measures exactly as the controller does.
    rollout_srm_grace_s: float = Field(default=2.0, ge=0, le=600)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The rollout controller run as one of the service's workers (``LIFTGATE_ROLLOUT_*``): read
    # from the environment with everything else when the entry point builds these settings.
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    # Webhook deliveries (``LIFTGATE_NOTIFY_*``): the worker, retries, the SSRF policy.
    notify: NotifySettings = Field(default_factory=NotifySettings)

    @field_validator("read_token", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value  # compose passes an unset variable as ""

    @field_validator("admin_token", "read_token")
    @classmethod
    def _refuse_weak_token(cls, value: str | None) -> str | None:
        if value is not None and (value.lower() in _WEAK_TOKENS or len(set(value)) < 6):
            raise ValueError("token is a default or trivially weak value; generate a random one")
        return value
