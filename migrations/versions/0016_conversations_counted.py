"""conversations_counted: the conversations ingest has counted, instead of a probe per turn

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 14:00:00.000000

Until now ingest decided whether a turn opens a conversation (``unit_rollups.conversations``)
by probing ``interactions`` through ``ix_interactions_conversation_id`` for a stored primary
turn of the conversation in the experiment: an index descent and a heap fetch per
conversation per batch, and an index every COPY of ``interactions`` wrote. From this revision
a batch inserts its conversations into ``conversations_counted`` (``ON CONFLICT DO NOTHING``)
and counts those it inserted, as ``feedback_counted`` does for yes/no feedback: one small
upsert per conversation and batch, and concurrent batches holding turns of one new
conversation count it once (the probe could not see another transaction's uncommitted turn).
The upgrade fills the table from the stored counted turns and drops the index.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The turns ingest counts (analytics.ingest: primary, in an experiment arm) with a conversation.
_FILL = """
INSERT INTO conversations_counted (experiment_id, conversation_id)
SELECT DISTINCT experiment_id, conversation_id FROM interactions
WHERE role = 'primary' AND experiment_id IS NOT NULL AND variant IS NOT NULL AND conversation_id IS NOT NULL
"""


def upgrade() -> None:
    op.create_table(
        "conversations_counted",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("experiment_id", "conversation_id", name=op.f("pk_conversations_counted")),
    )
    op.execute(_FILL)
    op.drop_index("ix_interactions_conversation_id", table_name="interactions")


def downgrade() -> None:
    op.create_index(
        "ix_interactions_conversation_id",
        "interactions",
        ["conversation_id"],
        unique=False,
        postgresql_where=sa.text("conversation_id IS NOT NULL"),
    )
    op.drop_table("conversations_counted")
