"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 01:35:46.479163
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("revoked", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
        sa.UniqueConstraint("name", name=op.f("uq_api_keys_name")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("entity", sa.String(length=64), nullable=False),
        sa.Column("entity_id", sa.String(length=128), nullable=True),
        sa.Column("before", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("after", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_entity", "audit_log", ["entity", "entity_id"], unique=False)
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("topic", sa.String(length=256), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=True),
        sa.Column("offset", sa.BigInteger(), nullable=True),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
    )
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("route", sa.String(length=128), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="draft", nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("unit_key", sa.String(length=16), server_default="auto", nullable=False),
        sa.Column("coverage", sa.Double(), server_default="1", nullable=False),
        sa.Column("targeting", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("forced", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("shadow_sample_rate", sa.Double(), server_default="1", nullable=False),
        sa.Column("fallback_to_control", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("content_logging", sa.String(length=16), server_default="none", nullable=False),
        sa.Column("metrics", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("rollout_plan", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("rollout_stage", sa.Integer(), nullable=True),
        sa.Column("stage_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("mode IN ('ab', 'shadow', 'rollout')", name=op.f("ck_experiments_mode")),
        sa.CheckConstraint(
            "status IN ('draft', 'running', 'paused', 'stopped', 'rolled_back', 'completed')",
            name=op.f("ck_experiments_status"),
        ),
        sa.CheckConstraint("coverage >= 0 AND coverage <= 1", name=op.f("ck_experiments_coverage")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("name", name=op.f("uq_experiments_name")),
    )
    op.create_index(op.f("ix_experiments_route"), "experiments", ["route"], unique=False)
    op.create_index(
        "uq_experiments_running_route",
        "experiments",
        ["route"],
        unique=True,
        postgresql_where="status = 'running'",
    )
    op.create_table(
        "feedback",
        sa.Column("event_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=256), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("tags", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("ingested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_feedback")),
    )
    op.create_index("ix_feedback_request_id", "feedback", ["request_id"], unique=False)
    op.create_index(
        "ix_feedback_unattributed",
        "feedback",
        ["request_id"],
        unique=False,
        postgresql_where="experiment_id IS NULL",
    )
    op.create_table(
        "interactions",
        sa.Column("event_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("route", sa.String(length=128), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("unit_source", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("pair_id", sa.String(length=64), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("endpoint", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("upstream", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("response_chars", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("fallback", sa.Boolean(), nullable=False),
        sa.Column("fallback_from", sa.String(length=64), nullable=True),
        sa.Column("conversation_id", sa.String(length=128), nullable=True),
        sa.Column("tags", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_interactions")),
    )
    op.create_index(
        "ix_interactions_experiment_variant_ts",
        "interactions",
        ["experiment_id", "variant", "ts"],
        unique=False,
    )
    op.create_index(
        "ix_interactions_pair_id",
        "interactions",
        ["pair_id"],
        unique=False,
        postgresql_where="pair_id IS NOT NULL",
    )
    op.create_index("ix_interactions_request_id", "interactions", ["request_id"], unique=False)
    op.create_index(
        "ix_interactions_conversation_id",
        "interactions",
        ["conversation_id"],
        unique=False,
        postgresql_where="conversation_id IS NOT NULL",
    )
    op.create_table(
        "latency_histograms",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("segment", sa.String(length=256), server_default="", nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("count", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint(
            "experiment_id", "metric", "segment", "variant", "bucket", name=op.f("pk_latency_histograms")
        ),
        postgresql_with={"fillfactor": 80},
    )
    op.create_table(
        "metric_definitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("definition", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_definitions")),
        sa.UniqueConstraint("name", name=op.f("uq_metric_definitions_name")),
    )
    op.create_table(
        "preperiod_rollups",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("requests", sa.Double(), server_default="0", nullable=False),
        sa.Column("errors", sa.Double(), server_default="0", nullable=False),
        sa.Column("fallbacks", sa.Double(), server_default="0", nullable=False),
        sa.Column("latency_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("prompt_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("completion_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("response_chars", sa.Double(), server_default="0", nullable=False),
        sa.Column("conversations", sa.Double(), server_default="0", nullable=False),
        sa.Column("turns", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_up", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_down", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("regenerates", sa.Double(), server_default="0", nullable=False),
        sa.Column("copies", sa.Double(), server_default="0", nullable=False),
        sa.Column("edits", sa.Double(), server_default="0", nullable=False),
        sa.Column("continued", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("counters", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("experiment_id", "unit_id", name=op.f("pk_preperiod_rollups")),
    )
    op.create_table(
        "segment_rollups",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("segment", sa.String(length=256), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("first_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Double(), server_default="0", nullable=False),
        sa.Column("errors", sa.Double(), server_default="0", nullable=False),
        sa.Column("fallbacks", sa.Double(), server_default="0", nullable=False),
        sa.Column("latency_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("prompt_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("completion_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("response_chars", sa.Double(), server_default="0", nullable=False),
        sa.Column("conversations", sa.Double(), server_default="0", nullable=False),
        sa.Column("turns", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_up", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_down", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("regenerates", sa.Double(), server_default="0", nullable=False),
        sa.Column("copies", sa.Double(), server_default="0", nullable=False),
        sa.Column("edits", sa.Double(), server_default="0", nullable=False),
        sa.Column("continued", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("counters", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.PrimaryKeyConstraint(
            "experiment_id", "segment", "variant", "unit_id", name=op.f("pk_segment_rollups")
        ),
        postgresql_with={"fillfactor": 80},
    )
    op.create_table(
        "unit_rollups",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("first_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Double(), server_default="0", nullable=False),
        sa.Column("errors", sa.Double(), server_default="0", nullable=False),
        sa.Column("fallbacks", sa.Double(), server_default="0", nullable=False),
        sa.Column("latency_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ttft_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("prompt_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("completion_tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("response_chars", sa.Double(), server_default="0", nullable=False),
        sa.Column("conversations", sa.Double(), server_default="0", nullable=False),
        sa.Column("turns", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_up", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_down", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("ratings_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("regenerates", sa.Double(), server_default="0", nullable=False),
        sa.Column("copies", sa.Double(), server_default="0", nullable=False),
        sa.Column("edits", sa.Double(), server_default="0", nullable=False),
        sa.Column("continued", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_n", sa.Double(), server_default="0", nullable=False),
        sa.Column("task_success_sum", sa.Double(), server_default="0", nullable=False),
        sa.Column("counters", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.PrimaryKeyConstraint("experiment_id", "variant", "unit_id", name=op.f("pk_unit_rollups")),
        postgresql_with={"fillfactor": 80},
    )
    op.create_table(
        "upstreams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("base_url", sa.String(length=1024), nullable=False),
        sa.Column("api_key", sa.Text(), nullable=True),
        sa.Column("timeout_s", sa.Double(), server_default="60", nullable=False),
        sa.Column("connect_timeout_s", sa.Double(), server_default="5", nullable=False),
        sa.Column("max_connections", sa.Integer(), server_default="100", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_upstreams")),
        sa.UniqueConstraint("name", name=op.f("uq_upstreams_name")),
    )
    op.create_table(
        "analysis_snapshots",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("report", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_analysis_snapshots_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_analysis_snapshots")),
    )
    op.create_index(
        "ix_analysis_snapshots_experiment_created",
        "analysis_snapshots",
        ["experiment_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "rollout_decisions",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=True),
        sa.Column("to_stage", sa.Integer(), nullable=True),
        sa.Column("decision", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_rollout_decisions_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_decisions")),
    )
    op.create_index(
        "ix_rollout_decisions_experiment_created",
        "rollout_decisions",
        ["experiment_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "variants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("upstream_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("weight", sa.Double(), server_default="0", nullable=False),
        sa.Column("is_control", sa.Boolean(), server_default="false", nullable=False),
        sa.CheckConstraint("weight >= 0", name=op.f("ck_variants_weight")),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_variants_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["upstream_id"], ["upstreams.id"], name=op.f("fk_variants_upstream_id_upstreams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_variants")),
        sa.UniqueConstraint("experiment_id", "name", name=op.f("uq_variants_experiment_id")),
    )
    op.create_index(op.f("ix_variants_experiment_id"), "variants", ["experiment_id"], unique=False)
    op.create_index(op.f("ix_variants_upstream_id"), "variants", ["upstream_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_variants_upstream_id"), table_name="variants")
    op.drop_index(op.f("ix_variants_experiment_id"), table_name="variants")
    op.drop_table("variants")
    op.drop_index("ix_rollout_decisions_experiment_created", table_name="rollout_decisions")
    op.drop_table("rollout_decisions")
    op.drop_index("ix_analysis_snapshots_experiment_created", table_name="analysis_snapshots")
    op.drop_table("analysis_snapshots")
    op.drop_table("upstreams")
    op.drop_table("unit_rollups")
    op.drop_table("segment_rollups")
    op.drop_table("preperiod_rollups")
    op.drop_table("metric_definitions")
    op.drop_table("latency_histograms")
    op.drop_index("ix_interactions_request_id", table_name="interactions")
    op.drop_index(
        "ix_interactions_conversation_id",
        table_name="interactions",
        postgresql_where="conversation_id IS NOT NULL",
    )
    op.drop_index(
        "ix_interactions_pair_id", table_name="interactions", postgresql_where="pair_id IS NOT NULL"
    )
    op.drop_index("ix_interactions_experiment_variant_ts", table_name="interactions")
    op.drop_table("interactions")
    op.drop_index("ix_feedback_unattributed", table_name="feedback", postgresql_where="experiment_id IS NULL")
    op.drop_index("ix_feedback_request_id", table_name="feedback")
    op.drop_table("feedback")
    op.drop_index(
        "uq_experiments_running_route", table_name="experiments", postgresql_where="status = 'running'"
    )
    op.drop_index(op.f("ix_experiments_route"), table_name="experiments")
    op.drop_table("experiments")
    op.drop_table("dead_letters")
    op.drop_index("ix_audit_log_entity", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("api_keys")
