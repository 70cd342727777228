"""latency samples: a bounded request-level sample per variant and stage (rank tests)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "latency_samples",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("segment", sa.String(length=256), server_default="", nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("sample_key", sa.BigInteger(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint(
            "experiment_id", "metric", "segment", "variant", "sample_key", name=op.f("pk_latency_samples")
        ),
    )


def downgrade() -> None:
    op.drop_table("latency_samples")
