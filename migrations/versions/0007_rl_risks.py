"""RL risks: the task category of each interaction, and judge scores

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 04:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing (PostgreSQL stores the NULL lazily).
    op.add_column("interactions", sa.Column("category", sa.String(length=32), nullable=True))
    op.create_table(
        "judgements",
        sa.Column("event_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("judge", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=8), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("pair_id", sa.String(length=64), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("ingested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_judgements")),
    )
    op.create_index("ix_judgements_request_id", "judgements", ["request_id"], unique=False)
    op.create_index(
        "ix_judgements_experiment_variant_ts", "judgements", ["experiment_id", "variant", "ts"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_judgements_experiment_variant_ts", table_name="judgements")
    op.drop_index("ix_judgements_request_id", table_name="judgements")
    op.drop_table("judgements")
    op.drop_column("interactions", "category")
