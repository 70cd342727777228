"""hashed n-grams: the keyed hashes of sampled responses' word 1–3-grams (content logging hashed)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "response_ngrams",
        sa.Column("event_id", postgresql.UUID(as_uuid=False), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=True),
        sa.Column("category", sa.String(length=32), nullable=True),
        sa.Column("grams", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("ingested_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_response_ngrams")),
    )
    op.create_index(
        "ix_response_ngrams_experiment_variant_ts",
        "response_ngrams",
        ["experiment_id", "variant", "ts"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_response_ngrams_experiment_variant_ts", table_name="response_ngrams")
    op.drop_table("response_ngrams")
