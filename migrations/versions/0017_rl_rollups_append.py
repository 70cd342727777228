"""rl_rollups appended to: no primary key, a row per counted response and per counted thumb

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 12:00:00.000000

Until now ingest upserted ``rl_rollups`` per (experiment, variant, unit, category, length
bin). Nearly every response has a key of its own there (a unit rarely repeats a category and
length bin), so each upsert was an index probe and an insert per response anyway, and the
batch's rows were sorted for it: costlier than appending the rows (the figures:
bench/ingest/README.md). From this revision ingest appends a row per counted response
and per counted thumb, and readers sum per key (``analytics.report.risks``). The upgrade
keeps the stored rows (each key once, a valid sum); the primary key becomes an index on the
experiment, which the report filters on. The downgrade sums the rows per key back into one.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = "experiment_id, variant, unit_id, category, lbin"


def upgrade() -> None:
    op.drop_constraint("pk_rl_rollups", "rl_rollups", type_="primary")
    op.create_index("ix_rl_rollups_experiment_id", "rl_rollups", ["experiment_id"])
    op.execute("ALTER TABLE rl_rollups SET (fillfactor = 100)")  # rows are never updated


def downgrade() -> None:
    op.execute(
        f"""
        CREATE TEMP TABLE rl_rollups_summed ON COMMIT DROP AS
        SELECT {_KEY}, sum(responses) AS responses, sum(tokens) AS tokens,
            sum(thumbs_up) AS thumbs_up, sum(thumbs_down) AS thumbs_down
        FROM rl_rollups GROUP BY {_KEY}
        """
    )
    op.execute("TRUNCATE rl_rollups")
    op.execute(
        f"INSERT INTO rl_rollups ({_KEY}, responses, tokens, thumbs_up, thumbs_down)"
        f" SELECT {_KEY}, responses, tokens, thumbs_up, thumbs_down FROM rl_rollups_summed"
    )
    op.drop_index("ix_rl_rollups_experiment_id", table_name="rl_rollups")
    op.create_primary_key("pk_rl_rollups", "rl_rollups", ["experiment_id", "variant", "unit_id", "category", "lbin"])
    op.execute("ALTER TABLE rl_rollups SET (fillfactor = 80)")
