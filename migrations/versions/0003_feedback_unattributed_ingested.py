"""feedback: partial index on ingested_at of unattributed rows (incremental sweep)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 10:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_feedback_unattributed_ingested",
        "feedback",
        ["ingested_at"],
        unique=False,
        postgresql_where=sa.text("experiment_id IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_feedback_unattributed_ingested",
        table_name="feedback",
        postgresql_where=sa.text("experiment_id IS NULL"),
    )
