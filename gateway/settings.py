"""Gateway settings (environment prefix ``LIFTGATE_``), built once in the entry point.

Every limit below is documented in docs/operations.md ("Limits"); the defaults are meant for
a gateway exposed to a network of clients it does not fully trust.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from eventbus import ClientChoice
from gateway.feedback import parse_kinds
from serving.settings import ConnectionSettings

_WEAK_TOKENS = frozenset({"changeme", "change-me", "admin", "secret", "token", "password", "liftgate"})
MIN_TOKEN_LENGTH = 16
KiB = 1024
MiB = 1024 * KiB


class GatewaySettings(ConnectionSettings):
    """Everything the gateway process needs; passed explicitly to ``create_app``."""

    model_config = SettingsConfigDict(env_prefix="LIFTGATE_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:15432/liftgate"
    # Required: the admin API refuses to run with a missing, short or default token.
    admin_token: str = Field(min_length=MIN_TOKEN_LENGTH)
    # Client API keys on /v1/*: ``required`` (default: fail closed — no valid key, no
    # service, also when no key exists at all) or ``off`` (anyone who can reach the port).
    # Never inferred from how many keys exist.
    client_keys: Literal["off", "required"] = "required"
    kafka_bootstrap: str | None = None
    # Kafka client library: confluent (librdkafka), python (kafka-python), auto (confluent when
    # it can be imported); see docs/operations.md ("Kafka client").
    kafka_client: ClientChoice = "auto"
    # Durable spool of the Kafka sink while the broker is unreachable (one claimed subdir per process).
    spool_dir: str = ".liftgate/spool"
    # fsync period of spooled events Kafka has not acknowledged: what a power loss may lose (0: each write).
    spool_fsync_interval_s: float = Field(default=1.0, ge=0, le=3600)
    refresh_interval_s: float = Field(default=0.5, gt=0, le=1.0)
    shadow_concurrency: int = Field(default=32, ge=1, le=10_000)
    shadow_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
    # Bytes of mirrored request bodies queued or in flight; a mirror that would exceed it is dropped.
    shadow_queue_bytes: int = Field(default=64 * MiB, ge=64 * KiB, le=16 * 1024 * MiB)
    # Request ids of recent calls kept per process: feedback for an id not among them is
    # accepted with a warning (it may be older, or served by another replica).
    feedback_memory: int = Field(default=100_000, ge=0, le=10_000_000)
    # Custom feedback kinds accepted besides those metric definitions read (comma-separated):
    # kinds collected before a metric uses them. Any other custom kind is refused (400).
    feedback_kinds: str = Field(default="judge_score", max_length=10_000)
    # Request bodies: the completion paths, /v1/feedback, everything else (admin, ...).
    max_body_bytes: int = Field(default=32 * MiB, ge=KiB, le=1024 * MiB)
    max_feedback_body_bytes: int = Field(default=64 * KiB, ge=KiB, le=16 * MiB)
    max_admin_body_bytes: int = Field(default=1 * MiB, ge=KiB, le=64 * MiB)
    # Request line + headers of one request.
    max_header_bytes: int = Field(default=64 * KiB, ge=4 * KiB, le=16 * MiB)
    # Server timeouts (besides header_timeout_s and the staged close's linger_s/linger_bytes,
    # serving.settings): a request's body must arrive within body_timeout_s of its headers;
    # an idle keep-alive connection is closed after keep_alive_timeout_s.
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    keep_alive_timeout_s: int = Field(default=5, ge=1, le=600)
    # Per client (its API key, or its IP address when keys are off), per worker process:
    # completion requests in flight (0 = no limit) and /v1/feedback calls per second
    # (token bucket of feedback_burst; 0 = no limit).
    client_max_concurrency: int = Field(default=64, ge=0, le=1_000_000)
    feedback_rate: float = Field(default=100.0, ge=0, le=1_000_000)
    feedback_burst: int = Field(default=200, ge=1, le=10_000_000)
    # Task categories (gateway.category): a YAML/JSON rules file; unset = the built-in rules.
    category_rules: str | None = None
    # Online judge (gateway.judge): an OpenAI-compatible endpoint scoring a share of
    # responses off the hot path. Off unless judge_url is set and judge_sample_rate > 0.
    judge_url: str | None = None
    judge_model: str = "judge"
    judge_api_key: str | None = None
    judge_name: str = Field(default="judge", min_length=1, max_length=128)
    judge_sample_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    judge_rubric: str | None = None
    judge_score_min: float = 1.0
    judge_score_max: float = 10.0
    judge_concurrency: int = Field(default=4, ge=1, le=1000)
    judge_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
    judge_queue_bytes: int = Field(default=16 * MiB, ge=64 * KiB, le=4 * 1024 * MiB)
    judge_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # The per-deployment content key of experiments with content logging ``hashed``: it keys
    # the digests of their prompts and answers (gateway.recorder) and the hashed n-grams of a
    # share of their responses (gateway.ngrams; also the analytics service's key, to resolve
    # an operator's phrase list). Unset: such experiments store no digest and no n-gram.
    ngram_key: str | None = Field(default=None, repr=False)
    ngram_sample_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    ngram_queue_size: int = Field(default=1000, ge=1, le=1_000_000)
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

    @field_validator("feedback_kinds")
    @classmethod
    def _check_kinds(cls, value: str) -> str:
        parse_kinds(value)  # a bad name stops the gateway at start, never a request
        return value
