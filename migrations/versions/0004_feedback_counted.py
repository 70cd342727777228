"""feedback_counted: yes/no feedback counted once per response and kind

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback_counted",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=256), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "kind", name=op.f("pk_feedback_counted")),
    )
    # What was counted before: a later repeat of it is then not counted again.
    op.execute(
        """
        INSERT INTO feedback_counted (request_id, kind)
        SELECT DISTINCT request_id, kind FROM feedback
        WHERE experiment_id IS NOT NULL AND variant IS NOT NULL
            AND kind IN ('thumbs_up', 'thumbs_down', 'regenerate', 'copy', 'edit', 'continued', 'task_success')
            AND (value > 0 OR kind = 'task_success')
        """
    )


def downgrade() -> None:
    op.drop_table("feedback_counted")
