"""dataset replays: stored offline replay results of production datasets (win rates)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 07:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_replays",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("baseline", sa.String(length=64), nullable=False),
        sa.Column("candidate", sa.String(length=64), nullable=False),
        sa.Column("baseline_run_id", sa.Integer(), nullable=False),
        sa.Column("candidate_run_id", sa.Integer(), nullable=False),
        sa.Column("judge", sa.String(length=256), nullable=False),
        sa.Column("items", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("overall", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("categories", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["dataset_versions.id"],
            name=op.f("fk_dataset_replays_version_id_dataset_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_replays")),
    )
    op.create_index(op.f("ix_dataset_replays_version_id"), "dataset_replays", ["version_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_dataset_replays_version_id"), table_name="dataset_replays")
    op.drop_table("dataset_replays")
