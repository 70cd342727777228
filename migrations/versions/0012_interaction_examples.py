"""interaction examples: index serving the hash-ordered sample of a variant's requests

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 07:00:00.000000

``analytics.report.examples`` lists a variant's requests in the order of
``hashtextextended(request_id, 0)`` (a uniform sample, stable across loads) with a keyset
cursor on (hash, event_id); this index serves that order and cursor as a range scan.
On a large existing table, create it with ``CREATE INDEX CONCURRENTLY`` by hand first (the
statement below then finds it and does nothing).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_interactions_examples ON interactions"
        " (experiment_id, variant, hashtextextended(request_id, 0), event_id)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_interactions_examples")
