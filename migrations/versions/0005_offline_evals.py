"""offline evals: datasets, runs, results, output cache, gate declarations and decisions

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 22:54:22.741110
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("item_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_datasets")),
        sa.UniqueConstraint("name", name=op.f("uq_eval_datasets_name")),
    )
    op.create_table(
        "eval_output_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("latency_ms", sa.Double(), nullable=True),
        sa.Column("scorer_version", sa.String(length=16), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_eval_output_cache")),
    )
    op.create_table(
        "eval_dataset_items",
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.String(length=256), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("item", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["eval_datasets.id"],
            name=op.f("fk_eval_dataset_items_dataset_id_eval_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dataset_id", "item_id", name=op.f("pk_eval_dataset_items")),
    )
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("dataset_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("upstream", sa.String(length=128), nullable=False),
        sa.Column("base_url", sa.String(length=1024), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("samples", sa.Integer(), server_default="1", nullable=False),
        sa.Column("status", sa.String(length=16), server_default="running", nullable=False),
        sa.Column("items", sa.Integer(), server_default="0", nullable=False),
        sa.Column("summary", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'interrupted', 'failed')", name=op.f("ck_eval_runs_status")
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["eval_datasets.id"],
            name=op.f("fk_eval_runs_dataset_id_eval_datasets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_eval_runs_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_runs")),
    )
    op.create_index(
        "ix_eval_runs_experiment_variant",
        "eval_runs",
        ["experiment_id", "variant", "started_at"],
        unique=False,
    )
    op.create_index(op.f("ix_eval_runs_fingerprint"), "eval_runs", ["fingerprint"], unique=False)
    op.create_index(op.f("ix_eval_runs_run_key"), "eval_runs", ["run_key"], unique=False)
    op.create_table(
        "gate_decisions",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("baseline_variant", sa.String(length=64), nullable=False),
        sa.Column("candidate_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("baseline_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("upstream", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("reasons", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("suites", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("declaration", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_gate_decisions_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gate_decisions")),
    )
    op.create_index(
        op.f("ix_gate_decisions_candidate_fingerprint"),
        "gate_decisions",
        ["candidate_fingerprint"],
        unique=False,
    )
    op.create_index(
        "ix_gate_decisions_experiment_variant",
        "gate_decisions",
        ["experiment_id", "variant", "created_at"],
        unique=False,
    )
    op.create_table(
        "offline_gates",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("declaration", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_offline_gates_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_offline_gates")),
    )
    op.create_table(
        "eval_results",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("item_id", sa.String(length=256), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=True),
        sa.Column("cached", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["eval_runs.id"], name=op.f("fk_eval_results_run_id_eval_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "item_id", "sample", name=op.f("pk_eval_results")),
    )


def downgrade() -> None:
    op.drop_table("eval_results")
    op.drop_table("offline_gates")
    op.drop_index("ix_gate_decisions_experiment_variant", table_name="gate_decisions")
    op.drop_index(op.f("ix_gate_decisions_candidate_fingerprint"), table_name="gate_decisions")
    op.drop_table("gate_decisions")
    op.drop_index(op.f("ix_eval_runs_run_key"), table_name="eval_runs")
    op.drop_index(op.f("ix_eval_runs_fingerprint"), table_name="eval_runs")
    op.drop_index("ix_eval_runs_experiment_variant", table_name="eval_runs")
    op.drop_table("eval_runs")
    op.drop_table("eval_dataset_items")
    op.drop_table("eval_output_cache")
    op.drop_table("eval_datasets")
