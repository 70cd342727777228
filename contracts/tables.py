"""Table definitions shared by the gateway (config snapshot, Direct sink) and analytics.

SQLAlchemy 2.0 declarative models, no logic. Every change here needs an Alembic
revision in ``migrations/versions``; ``tests/contracts/test_migrations.py`` fails when
the models and the migrations drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSONB, list[Any]: JSONB}


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Upstream(Base):
    """An OpenAI-compatible model server (vLLM, the simulator, a hosted API)."""

    __tablename__ = "upstreams"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    base_url: Mapped[str] = mapped_column(String(1024))
    # Needed in clear to call the upstream; never logged or returned by the API.
    api_key: Mapped[str | None] = mapped_column(Text)
    timeout_s: Mapped[float] = mapped_column(Double, server_default="60")
    connect_timeout_s: Mapped[float] = mapped_column(Double, server_default="5")
    max_connections: Mapped[int] = mapped_column(Integer, server_default="100")
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class Experiment(Base):
    """A route's experiment: how its traffic is split between a control and candidates."""

    __tablename__ = "experiments"
    __table_args__ = (
        CheckConstraint("mode IN ('ab', 'shadow', 'rollout')", name="mode"),
        CheckConstraint(
            "status IN ('draft', 'running', 'paused', 'stopped', 'rolled_back', 'completed')", name="status"
        ),
        CheckConstraint("coverage >= 0 AND coverage <= 1", name="coverage"),
        # At most one running experiment per route.
        Index("uq_experiments_running_route", "route", unique=True, postgresql_where="status = 'running'"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    route: Mapped[str] = mapped_column(String(128), index=True)
    mode: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), server_default="draft")
    description: Mapped[str | None] = mapped_column(Text)
    salt: Mapped[str] = mapped_column(String(64))
    unit_key: Mapped[str] = mapped_column(String(16), server_default="auto")
    coverage: Mapped[float] = mapped_column(Double, server_default="1")
    targeting: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    forced: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    shadow_sample_rate: Mapped[float] = mapped_column(Double, server_default="1")
    fallback_to_control: Mapped[bool] = mapped_column(Boolean, server_default="false")
    # What clients learn of their arm: {"echo_model": bool, "variant_header": on_request|always|never}
    # (defaults when a key is absent: the route as ``model``, the header only when asked for).
    blinding: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    content_logging: Mapped[str] = mapped_column(String(16), server_default="none")
    metrics: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    rollout_plan: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    rollout_stage: Mapped[int | None] = mapped_column(Integer)
    # Tag keys ingest rolls up per segment (``rollout_stage`` always is, whether listed or not).
    segment_tags: Mapped[list[str]] = mapped_column(ARRAY(String(127)), server_default="{}")
    stage_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status_reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()

    variants: Mapped[list[Variant]] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", order_by="Variant.id"
    )


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (
        UniqueConstraint("experiment_id", "name"),
        CheckConstraint("weight >= 0", name="weight"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    upstream_id: Mapped[int] = mapped_column(ForeignKey("upstreams.id"), index=True)
    model: Mapped[str] = mapped_column(String(256))
    weight: Mapped[float] = mapped_column(Double, server_default="0")
    is_control: Mapped[bool] = mapped_column(Boolean, server_default="false")

    experiment: Mapped[Experiment] = relationship(back_populates="variants")
    upstream: Mapped[Upstream] = relationship()


class Interaction(Base):
    """One model call (raw event). Append-only; ``event_id`` is the idempotency key."""

    __tablename__ = "interactions"
    __table_args__ = (
        Index("ix_interactions_experiment_variant_ts", "experiment_id", "variant", "ts"),
        Index("ix_interactions_request_id", "request_id"),
        Index("ix_interactions_pair_id", "pair_id", postgresql_where="pair_id IS NOT NULL"),
        # Examples side by side (analytics.report.examples): a variant's requests in the order of
        # a hash of their request id (a uniform sample), read page by page with a keyset cursor.
        Index(
            "ix_interactions_examples",
            "experiment_id",
            "variant",
            text("hashtextextended(request_id, 0)"),
            "event_id",
        ),
    )

    event_id: Mapped[Any] = mapped_column(UUID(as_uuid=False), primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(64))
    route: Mapped[str] = mapped_column(String(128))
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str | None] = mapped_column(String(64))
    unit_id: Mapped[str] = mapped_column(String(256))
    unit_source: Mapped[str] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(16))
    pair_id: Mapped[str | None] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(256))
    upstream: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(8))
    http_status: Mapped[int] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(64))
    latency_ms: Mapped[float] = mapped_column(Double)
    ttft_ms: Mapped[float | None] = mapped_column(Double)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    response_chars: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    stream: Mapped[bool] = mapped_column(Boolean)
    fallback: Mapped[bool] = mapped_column(Boolean)
    fallback_from: Mapped[str | None] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(String(128))
    tags: Mapped[dict[str, Any]] = mapped_column(JSONB)
    prompt: Mapped[str | None] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    # The task category assigned by the gateway before treatment (None: not classified).
    category: Mapped[str | None] = mapped_column(String(32))
    ingested_at: Mapped[datetime] = _created()


class Judgement(Base):
    """A judge's or reward model's score of one response (``contracts.events.JudgeEvent``).

    ``event_id`` is derived from (request id, judge), so a judgement is stored once."""

    __tablename__ = "judgements"
    __table_args__ = (
        Index("ix_judgements_request_id", "request_id"),
        Index("ix_judgements_experiment_variant_ts", "experiment_id", "variant", "ts"),
    )

    event_id: Mapped[Any] = mapped_column(UUID(as_uuid=False), primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(64))
    unit_id: Mapped[str] = mapped_column(String(256))
    judge: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(8))
    latency_ms: Mapped[float] = mapped_column(Double)
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str | None] = mapped_column(String(64))
    pair_id: Mapped[str | None] = mapped_column(String(64))
    category: Mapped[str | None] = mapped_column(String(32))
    score: Mapped[float | None] = mapped_column(Double)
    error_type: Mapped[str | None] = mapped_column(String(64))
    ingested_at: Mapped[datetime] = _created()


class ResponseNgrams(Base):
    """The keyed hashes of a sampled response's word 1–3-grams (``contracts.events.NgramsEvent``,
    content logging ``hashed``): never its text. ``event_id`` is derived from the request id."""

    __tablename__ = "response_ngrams"
    __table_args__ = (Index("ix_response_ngrams_experiment_variant_ts", "experiment_id", "variant", "ts"),)

    event_id: Mapped[Any] = mapped_column(UUID(as_uuid=False), primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(64))
    unit_id: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(16))
    key_id: Mapped[str] = mapped_column(String(32))
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str | None] = mapped_column(String(64))
    category: Mapped[str | None] = mapped_column(String(32))
    grams: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    ingested_at: Mapped[datetime] = _created()


class Feedback(Base):
    """One feedback event; experiment/variant are filled from its interaction (either may come first)."""

    __tablename__ = "feedback"
    __table_args__ = (
        Index("ix_feedback_request_id", "request_id"),
        Index("ix_feedback_unattributed", "request_id", postgresql_where="experiment_id IS NULL"),
        # The consumer's incremental sweep: unattributed feedback stored since a time.
        Index("ix_feedback_unattributed_ingested", "ingested_at", postgresql_where="experiment_id IS NULL"),
    )

    event_id: Mapped[Any] = mapped_column(UUID(as_uuid=False), primary_key=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(String(64))
    unit_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(256))
    value: Mapped[float] = mapped_column(Double)
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str | None] = mapped_column(String(64))
    tags: Mapped[dict[str, Any]] = mapped_column(JSONB)
    ingested_at: Mapped[datetime] = _created()


class FeedbackCounted(Base):
    """The yes/no feedback already counted: one row per response (request id) and kind.

    Ingest counts a thumbs-up (or any kind of ``analytics.ingest.rollups.ONCE_KINDS``) for a response
    only in the transaction that inserts its row here, so 50 thumbs-up for one response
    count once, also when they arrive in concurrent batches.
    """

    __tablename__ = "feedback_counted"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(256), primary_key=True)


class ConversationCounted(Base):
    """The conversations already counted: one row per (experiment, conversation id).

    Ingest counts a conversation (``unit_rollups.conversations``) on its first counted turn
    only: the turn whose batch inserts the conversation's row here, so a conversation is
    counted once, also when its turns arrive in concurrent batches. (Its turns' rows stay in
    ``interactions``, which has no index on the conversation id: probing one per turn cost
    more than this table's upsert.)
    """

    __tablename__ = "conversations_counted"

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(String(128), primary_key=True)


#: Additive per-unit measures shared by ``unit_rollups`` and ``preperiod_rollups``. All are
#: double precision: Postgres sums float8 far faster than bigint (numeric accumulator),
#: and counts stay exact up to 2**53.
#: The measures an interaction contributes (the ingest COPY path folds exactly these) ...
INTERACTION_MEASURES: tuple[str, ...] = (
    "requests",
    "errors",
    "fallbacks",
    "latency_sum",
    "ttft_n",
    "ttft_sum",
    "prompt_tokens",
    "completion_tokens",
    "response_chars",
    "conversations",
    "turns",
)
#: ... and the ones feedback contributes.
FEEDBACK_MEASURES: tuple[str, ...] = (
    "thumbs_up",
    "thumbs_down",
    "ratings_n",
    "ratings_sum",
    "regenerates",
    "copies",
    "edits",
    "continued",
    "task_success_n",
    "task_success_sum",
)
ROLLUP_MEASURES: tuple[str, ...] = INTERACTION_MEASURES + FEEDBACK_MEASURES


def _measure() -> Mapped[float]:
    return mapped_column(Double, server_default="0")


class RollupMeasures:
    """The ROLLUP_MEASURES columns (mixin) and the custom-feedback ``counters``.

    ``counters`` holds custom feedback kinds as ``{"<kind>": sum, "<kind>:n": count}``, so
    new signals need no schema change.
    """

    requests: Mapped[float] = _measure()
    errors: Mapped[float] = _measure()
    fallbacks: Mapped[float] = _measure()
    latency_sum: Mapped[float] = _measure()
    ttft_n: Mapped[float] = _measure()
    ttft_sum: Mapped[float] = _measure()
    prompt_tokens: Mapped[float] = _measure()
    completion_tokens: Mapped[float] = _measure()
    response_chars: Mapped[float] = _measure()
    conversations: Mapped[float] = _measure()
    turns: Mapped[float] = _measure()
    thumbs_up: Mapped[float] = _measure()
    thumbs_down: Mapped[float] = _measure()
    ratings_n: Mapped[float] = _measure()
    ratings_sum: Mapped[float] = _measure()
    regenerates: Mapped[float] = _measure()
    copies: Mapped[float] = _measure()
    edits: Mapped[float] = _measure()
    continued: Mapped[float] = _measure()
    task_success_n: Mapped[float] = _measure()
    task_success_sum: Mapped[float] = _measure()
    counters: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")


class UnitRollup(RollupMeasures, Base):
    """Per-unit sufficient statistics for one experiment variant (whole experiment).

    The report aggregates these (n, Σx, Σx², Σxy) with SQL, so its cost grows with units,
    not with events. Tag breakdowns live in ``segment_rollups`` so the headline query
    scans only one row per unit.
    """

    __tablename__ = "unit_rollups"
    # Room on each page for HOT updates: ingest rewrites these rows in place all the time.
    __table_args__ = {"postgresql_with": {"fillfactor": 80}}

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    unit_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    first_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SegmentRollup(RollupMeasures, Base):
    """Like ``unit_rollups`` for one segment 'tag=value' (one row per event tag of the unit)."""

    __tablename__ = "segment_rollups"
    __table_args__ = {"postgresql_with": {"fillfactor": 80}}

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    unit_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    first_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))


#: ``rl_rollups.lbin``: bins per doubling of the response length, bins [2^(b/2) − 1,
#: 2^((b+1)/2) − 1) of completion tokens (the fold and the report's curve both use it).
LENGTH_BINS_PER_DOUBLING = 2


#: The RL-risk detectors' rollup: per (experiment, variant, unit, task category, length bin)
#: the successful primary responses, their completion tokens and their counted thumbs-up /
#: thumbs-down. Ingest appends (``analytics.ingest.rollups`` adds a row per counted response
#: and per counted thumb), so a key may have several rows: readers (the report's ``rl_risks``
#: section) sum per key. A background job moves appended rows into one ``compacted`` row per
#: key (``analytics.ingest.rollups.compact_rl_rollups``), the only rows ever updated; the
#: unique index over the key holds only those. No primary key.
RL_MEASURES: tuple[str, ...] = ("responses", "tokens", "thumbs_up", "thumbs_down")
rl_rollups = Table(
    "rl_rollups",
    Base.metadata,
    Column("experiment_id", Integer, nullable=False),
    Column("variant", String(64), nullable=False),
    Column("unit_id", String(256), nullable=False),
    Column("category", String(64), nullable=False),
    Column("lbin", Integer, nullable=False),
    *(Column(m, Double, nullable=False, server_default="0") for m in RL_MEASURES),
    Column("compacted", Boolean, nullable=False, server_default="false"),
    Index(None, "experiment_id", "compacted"),
    Index(
        "uq_rl_rollups_compacted",
        "experiment_id",
        "variant",
        "unit_id",
        "category",
        "lbin",
        unique=True,
        postgresql_where=text("compacted"),
    ),
)


class PreperiodRollup(RollupMeasures, Base):
    """A unit's own history on the experiment's route before it started (CUPED covariate).

    Same measures as ``unit_rollups`` so a metric's expression applies to both.
    """

    __tablename__ = "preperiod_rollups"

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    unit_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    computed_at: Mapped[datetime] = _created()


#: ``latency_histograms.bucket`` = floor(BUCKETS_PER_E · ln(max(ms, MIN_BUCKETED))): the fold
#: (``analytics.ingest.rollups.bucket_sql``) and ``analytics.stats.quantile.bucket_of``.
BUCKETS_PER_E = 20
#: Values below this share its bucket (a 0 ms latency has no logarithm).
MIN_BUCKETED = 0.01


class LatencyHistogram(Base):
    """Log-bucketed counts of latency/TTFT per experiment variant and segment (quantile metrics).

    ``bucket`` = floor(20·ln(ms)) (≈5% wide); see ``analytics.report.aggregate.bucket_bounds``.
    """

    __tablename__ = "latency_histograms"
    __table_args__ = {"postgresql_with": {"fillfactor": 80}}

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(32), primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True, server_default="")
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, server_default="0")


class LatencySample(Base):
    """A bounded uniform sample of request latencies/TTFTs per variant, overall and per stage.

    Rank tests (Mann–Whitney on per-batch quantiles: ``analytics.stats.rank``) need request-level
    values, which histograms do not keep. The sample is a bottom-k sketch: per (experiment,
    metric, segment, variant) the requests with the smallest ``sample_key`` (a hash of the
    request's identity) — uniform, the same on every replay, mergeable across consumers.
    The ingest inserts a request only while its key is below the group's current k-th
    smallest and among its batch's k smallest, so the table holds about k·(1 + ln(N/k))
    rows for N requests; readers take the k smallest. ``segment`` is '' or a rollout stage
    (``rollout_stage=N``); ``batch`` is hash(unit) mod 20, the unit's batch for per-batch
    quantiles.
    """

    __tablename__ = "latency_samples"

    experiment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(32), primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True, server_default="")
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    sample_key: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    batch: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Double)


class AnalysisSnapshot(Base):
    """A computed report for one experiment at one moment (also the lift time series).

    ``points``: the candidates' rows of the overall table the time series reads (a few
    hundred bytes a metric); ``report``: the whole report (tens of kB with tag segments),
    kept for recent and API-requested snapshots and one an hour after that (None once
    pruned, see ``analytics.report.snapshots.prune_snapshots``).
    """

    __tablename__ = "analysis_snapshots"
    __table_args__ = (Index("ix_analysis_snapshots_experiment_created", "experiment_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    points: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    source: Mapped[str] = mapped_column(String(16), server_default="periodic")
    created_at: Mapped[datetime] = _created()


class RolloutDecision(Base):
    """What the rollout controller (or an operator) decided, and the evidence for it."""

    __tablename__ = "rollout_decisions"
    __table_args__ = (Index("ix_rollout_decisions_experiment_created", "experiment_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    stage: Mapped[int | None] = mapped_column(Integer)
    to_stage: Mapped[int | None] = mapped_column(Integer)
    decision: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(128))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    created_at: Mapped[datetime] = _created()


class DeadLetter(Base):
    """A message the consumer could not decode or ingest: raw bytes and the reason."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    topic: Mapped[str] = mapped_column(String(256))
    partition: Mapped[int | None] = mapped_column(Integer)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    key: Mapped[bytes | None] = mapped_column(LargeBinary)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class AuditLog(Base):
    """Every admin change, with who did it and the state before and after."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_entity", "entity", "entity_id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    entity: Mapped[str] = mapped_column(String(64))
    entity_id: Mapped[str | None] = mapped_column(String(128))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()


class ApiKey(Base):
    """A client key for the /v1 endpoints; only its SHA-256 hash is stored."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    revoked: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _created()


class MetricDefinition(Base):
    """A user-defined metric (built-ins live in code); see analytics' metric catalogue."""

    __tablename__ = "metric_definitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    definition: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


metadata = Base.metadata


# ---------------------------------------------------------------- offline evaluation (evals/)


class EvalDataset(Base):
    """A dataset the offline evals ran on: a built-in suite or a user's file, by name."""

    __tablename__ = "eval_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    source: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    item_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class EvalDatasetItem(Base):
    """One item of a dataset as last loaded (the JSONL item format, see docs/evals.md)."""

    __tablename__ = "eval_dataset_items"

    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("eval_datasets.id", ondelete="CASCADE"), primary_key=True
    )
    item_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    category: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    item: Mapped[dict[str, Any]] = mapped_column(JSONB)


class EvalRun(Base):
    """One model (an experiment variant's upstream + model + sampling parameters) on one dataset.

    ``fingerprint`` = SHA-256 of the canonical JSON of {upstream, base_url, model, params}
    (docs/evals.md); ``run_key`` adds the dataset's fingerprint, the scorer version and the
    number of samples, and identifies the run a rerun resumes or reuses.
    """

    __tablename__ = "eval_runs"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'completed', 'interrupted', 'failed')", name="status"),
        Index("ix_eval_runs_experiment_variant", "experiment_id", "variant", "started_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_key: Mapped[str] = mapped_column(String(64), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("eval_datasets.id", ondelete="CASCADE"))
    dataset_fingerprint: Mapped[str] = mapped_column(String(64))
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    variant: Mapped[str | None] = mapped_column(String(64))
    upstream: Mapped[str] = mapped_column(String(128))
    base_url: Mapped[str] = mapped_column(String(1024))
    model: Mapped[str] = mapped_column(String(256))
    params: Mapped[dict[str, Any]] = mapped_column(JSONB)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    samples: Mapped[int] = mapped_column(Integer, server_default="1")
    status: Mapped[str] = mapped_column(String(16), server_default="running")
    items: Mapped[int] = mapped_column(Integer, server_default="0")
    summary: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    started_at: Mapped[datetime] = _created()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EvalResult(Base):
    """One scored output of a run (``error``: the call failed after its retries — never a pass)."""

    __tablename__ = "eval_results"

    run_id: Mapped[int] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), primary_key=True)
    item_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    sample: Mapped[int] = mapped_column(Integer, primary_key=True)
    category: Mapped[str] = mapped_column(String(64))
    output: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    passed: Mapped[bool] = mapped_column(Boolean)
    score: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Double)
    cached: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _created()


class EvalOutputCache(Base):
    """Model outputs by SHA-256 of (base URL, model, item fingerprint, parameters, sample), with the
    verifiable score of that output under ``scorer_version`` (None for judged items)."""

    __tablename__ = "eval_output_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    output: Mapped[str] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    latency_ms: Mapped[float | None] = mapped_column(Double)
    scorer_version: Mapped[str | None] = mapped_column(String(16))
    passed: Mapped[bool | None] = mapped_column(Boolean)
    score: Mapped[float | None] = mapped_column(Double)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class OfflineGateDeclaration(Base):
    """An experiment's ``offline_gate``: suites, margins, required improvements, minimum pass
    rates (validated by ``evals.gate.OfflineGate``). The rollout controller reads it."""

    __tablename__ = "offline_gates"

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    declaration: Mapped[dict[str, Any]] = mapped_column(JSONB)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[datetime] = _created()


class GateDecision(Base):
    """The offline gate's decision for one candidate variant, with its per-category evidence.

    ``candidate_fingerprint`` is the candidate's eval-run fingerprint (upstream + base URL +
    model + parameters): a passing decision vouches for exactly that candidate.
    """

    __tablename__ = "gate_decisions"
    __table_args__ = (
        Index("ix_gate_decisions_experiment_variant", "experiment_id", "variant", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    variant: Mapped[str] = mapped_column(String(64))
    baseline_variant: Mapped[str] = mapped_column(String(64))
    candidate_fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    baseline_fingerprint: Mapped[str] = mapped_column(String(64))
    upstream: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(256))
    params: Mapped[dict[str, Any]] = mapped_column(JSONB)
    passed: Mapped[bool] = mapped_column(Boolean)
    verdict: Mapped[str] = mapped_column(String(32))
    reasons: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    suites: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    evidence: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    declaration: Mapped[dict[str, Any]] = mapped_column(JSONB)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = _created()


class User(Base):
    """A person who signs in to the dashboard or calls the API with their own token.

    ``password_hash`` is a scrypt hash (``control.users``); roles are ``viewer`` (reads),
    ``operator`` (experiment and rollout actions) and ``admin`` (also users, upstreams and
    client keys). A disabled user keeps their row (the audit log names them) but cannot sign
    in, and their sessions and tokens stop working at once.
    """

    __tablename__ = "users"
    __table_args__ = (CheckConstraint("role IN ('viewer', 'operator', 'admin')", name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str] = mapped_column(String(256))
    disabled: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _created()


class UserToken(Base):
    """A user's API token for the CLI: only its SHA-256 hash is stored (shown once)."""

    __tablename__ = "user_tokens"
    __table_args__ = (UniqueConstraint("user_id", "label", name="uq_user_tokens_user_label"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    label: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    revoked: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _created()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UserSession(Base):
    """A signed-in browser: the cookie's SHA-256 hash, who it is, and its CSRF token.

    ``user_id`` is NULL for the bootstrap credentials (the admin token, the read token, a
    one-time sign-in link); ``basis`` then fingerprints the token it was opened with, so
    changing that token ends those sessions.
    """

    __tablename__ = "user_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    basis: Mapped[str] = mapped_column(String(64))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class SignInFailure(Base):
    """Failed sign-ins per account name (or per client address for token sign-ins): the lockout."""

    __tablename__ = "sign_in_failures"

    subject: Mapped[str] = mapped_column(String(160), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, server_default="0")
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = _created()


class UsedSignInLink(Base):
    """Nonces of one-time sign-in links already used (kept until the link would expire)."""

    __tablename__ = "used_sign_in_links"

    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


# ---------------------------------------------------------------- notifications (control/)


class Webhook(Base):
    """Where notifications go: a URL, the events it wants, its payload format and secret."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # Both needed in clear: the URL to call (a Slack URL is itself a credential), the secret
    # to sign with. Never logged or returned by the API (previews only).
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16), server_default="json")
    events: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    enabled: Mapped[bool] = mapped_column(Boolean, server_default="true")
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class NotificationEvent(Base):
    """The outbox: one row per event, written in the transaction of what it reports."""

    __tablename__ = "notification_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    experiment_id: Mapped[int | None] = mapped_column(Integer)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created()


class WebhookDelivery(Base):
    """One event to one webhook: its status, attempts, last error and latency (the delivery log)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("notification_events.id", ondelete="CASCADE"))
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = _created()
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Double)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created()
