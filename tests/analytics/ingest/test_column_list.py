"""One column list for an interaction row: the COPY path, the ON CONFLICT path's staging
table, the Python row builder and the C renderer all follow ``copy_text.INTERACTION_COLUMNS``."""

from __future__ import annotations

import re
from pathlib import Path

from analytics.ingest import copy_text, rollups
from contracts.tables import Interaction
from tests.analytics.ingest_helpers import interaction

COLUMNS = [c.strip() for c in copy_text.INTERACTION_COLUMNS.split(",")]


def test_the_column_list_is_every_column_of_interactions_the_database_does_not_fill() -> None:
    table = [c.name for c in Interaction.__table__.columns]
    assert [c for c in table if c != "ingested_at"] == COLUMNS


def test_the_on_conflict_paths_staging_table_has_the_same_columns_in_the_same_order() -> None:
    found = re.search(r"lg_stage_i \((.*?)\) ON COMMIT", rollups.TEMP_TABLES, re.S)
    assert found is not None
    assert [part.split()[0] for part in found.group(1).split(",")] == COLUMNS


def test_the_python_row_and_the_c_rendered_row_have_one_field_per_column() -> None:
    e = interaction(1, "control", "u", tags={"task": "a"}, conversation_id="c")
    assert len(copy_text.interaction_row(e, e.ts)) == len(COLUMNS)
    rows, fold = copy_text.render_c([e], {id(e)}, set())
    assert int.from_bytes(rows[:2], "big") == len(COLUMNS)  # a binary tuple starts with its field count
    assert int.from_bytes(fold[:2], "big") == len(rollups.FOLD_COLUMNS.split(","))


def test_the_c_renderer_reads_the_columns_in_the_column_lists_order() -> None:
    source = (Path(copy_text.__file__).parent / "_copyfmt.c").read_text()
    names = re.search(r"attr_names\[N_ATTRS\] = \{(.*?)\};", source, re.S)
    assert names is not None
    assert re.findall(r'"(\w+)"', names.group(1)) == COLUMNS
