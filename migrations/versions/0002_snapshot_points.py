"""snapshots: compact time-series points, prunable report bodies, source

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 09:55:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The candidates' rows of the overall table, as analytics.report.snapshots.series_points writes them.
_BACKFILL = """
UPDATE analysis_snapshots s SET points = coalesce((
    SELECT jsonb_agg(jsonb_build_object(
        'metric', r->'metric', 'variant', r->'variant', 'units', r->'units',
        'lift_relative', r->'lift_relative', 'ci_relative', r->'ci_relative',
        'sequential_ci_relative', r->'sequential_ci_relative',
        'p_value_sequential', r->'p_value_sequential') ORDER BY ord)
    FROM jsonb_array_elements(s.report->'results') WITH ORDINALITY AS x(r, ord)
    WHERE r->>'is_control' = 'false'), '[]'::jsonb)
"""


def upgrade() -> None:
    op.add_column(
        "analysis_snapshots",
        sa.Column("points", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
    )
    op.add_column(
        "analysis_snapshots",
        sa.Column("source", sa.String(length=16), server_default="periodic", nullable=False),
    )
    op.alter_column("analysis_snapshots", "report", existing_type=postgresql.JSONB(), nullable=True)
    op.execute(_BACKFILL)


def downgrade() -> None:
    op.execute("DELETE FROM analysis_snapshots WHERE report IS NULL")
    op.alter_column("analysis_snapshots", "report", existing_type=postgresql.JSONB(), nullable=False)
    op.drop_column("analysis_snapshots", "source")
    op.drop_column("analysis_snapshots", "points")
