"""experiments.segment_tags: the tag keys ingest rolls up per segment

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 20:30:00.000000

Until now ingest folded every tag of every counted event into ``segment_rollups`` (and the
per-segment latency histograms): a client sending many tags multiplied the segment work by
their number. From this revision only the keys an experiment declares here are folded, plus
``rollout_stage`` always (the rollout controller reads it). Existing experiments keep the
breakdowns they have: the upgrade declares the keys already present in their segment
rollups (at most 8, those with the most rows), so their reports do not change.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DECLARE_PRESENT = """
UPDATE experiments e SET segment_tags = k.keys
FROM (
    SELECT experiment_id, array_agg(key ORDER BY n DESC, key) FILTER (WHERE rank <= 8) AS keys
    FROM (
        SELECT experiment_id, key, n, row_number() OVER (PARTITION BY experiment_id ORDER BY n DESC, key) AS rank
        FROM (
            SELECT experiment_id, split_part(segment, '=', 1) AS key, count(*) AS n
            FROM segment_rollups GROUP BY 1, 2
        ) c WHERE key <> 'rollout_stage'
    ) r GROUP BY experiment_id
) k
WHERE e.id = k.experiment_id AND k.keys IS NOT NULL
"""


def upgrade() -> None:
    op.add_column(
        "experiments",
        sa.Column("segment_tags", ARRAY(sa.String(length=127)), server_default="{}", nullable=False),
    )
    op.execute(_DECLARE_PRESENT)


def downgrade() -> None:
    op.drop_column("experiments", "segment_tags")
