"""rl_rollups compacted in the background: appended rows are summed into one row per key

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03 15:00:00.000000

Ingest appends a row per counted response and per counted thumb (0017), so the table grows
as fast as ``interactions`` and the report's RL-risks section reads every row. From this
revision a background job (``analytics.ingest.rollups.compact_rl_rollups``, run by the
analytics service) moves appended rows into one *compacted* row per key: ``compacted``
marks those, and a unique index over the key holds only them. Appends stay as they were
(no key check, no lock); readers still sum per key, over compacted and appended rows alike.
The downgrade keeps every row (a valid input for 0017's readers, which sum per key).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = ["experiment_id", "variant", "unit_id", "category", "lbin"]


def upgrade() -> None:
    op.add_column("rl_rollups", sa.Column("compacted", sa.Boolean(), server_default="false", nullable=False))
    # The experiment's rows (the report) and its appended ones (the compaction), one index.
    op.drop_index("ix_rl_rollups_experiment_id", table_name="rl_rollups")
    op.create_index("ix_rl_rollups_experiment_id", "rl_rollups", ["experiment_id", "compacted"])
    op.create_index(
        "uq_rl_rollups_compacted", "rl_rollups", _KEY, unique=True, postgresql_where=sa.text("compacted")
    )


def downgrade() -> None:
    op.drop_index("uq_rl_rollups_compacted", table_name="rl_rollups")
    op.drop_index("ix_rl_rollups_experiment_id", table_name="rl_rollups")
    op.create_index("ix_rl_rollups_experiment_id", "rl_rollups", ["experiment_id"])
    op.drop_column("rl_rollups", "compacted")
