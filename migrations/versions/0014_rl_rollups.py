"""rl_rollups: the RL-risk detectors' per-unit sums, folded at ingest

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 11:00:00.000000

One row per (experiment, variant, unit, category, length bin) of primary ``ok`` responses:
their count, completion tokens and counted thumbs-up / thumbs-down (each once per
response, ``feedback_counted``'s rule). The report's ``rl_risks`` section reads these
instead of every response (``analytics.report.risks``); ``analytics.ingest.rollups`` folds
them with the other rollups. The upgrade backfills them from the stored rows (one pass
over ``interactions`` hash-joined with the thumbs of ``feedback``); the length bin
is ``floor(2·log2(1 + tokens))``, ``analytics.risks.curve.length_bin``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The fold's definition applied to the stored rows (analytics.ingest.rollups.RL_ROWS, frozen
# here as of this revision).
_BACKFILL = """
INSERT INTO rl_rollups (experiment_id, variant, unit_id, category, lbin, responses, tokens, thumbs_up, thumbs_down)
SELECT i.experiment_id, i.variant, i.unit_id, coalesce(i.category, 'other'),
    floor(2 * ln(1 + greatest(coalesce(i.completion_tokens, 0), 0)::float8) / ln(2.0::float8))::int,
    count(*), sum(greatest(coalesce(i.completion_tokens, 0), 0)),
    count(*) FILTER (WHERE f.up), count(*) FILTER (WHERE f.down)
FROM interactions i LEFT JOIN (
    SELECT request_id, experiment_id, bool_or(kind = 'thumbs_up') AS up, bool_or(kind = 'thumbs_down') AS down
    FROM feedback WHERE experiment_id IS NOT NULL AND kind IN ('thumbs_up', 'thumbs_down') AND value > 0
    GROUP BY request_id, experiment_id
) f ON f.request_id = i.request_id AND f.experiment_id = i.experiment_id
WHERE i.role = 'primary' AND i.status = 'ok' AND i.experiment_id IS NOT NULL AND i.variant IS NOT NULL
GROUP BY 1, 2, 3, 4, 5
"""


def upgrade() -> None:
    op.create_table(
        "rl_rollups",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("unit_id", sa.String(length=256), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("lbin", sa.Integer(), nullable=False),
        sa.Column("responses", sa.Double(), server_default="0", nullable=False),
        sa.Column("tokens", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_up", sa.Double(), server_default="0", nullable=False),
        sa.Column("thumbs_down", sa.Double(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint(
            "experiment_id", "variant", "unit_id", "category", "lbin", name=op.f("pk_rl_rollups")
        ),
        postgresql_with={"fillfactor": 80},
    )
    op.execute(_BACKFILL)


def downgrade() -> None:
    op.drop_table("rl_rollups")
