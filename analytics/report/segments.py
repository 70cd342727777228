"""Sufficient statistics for every tag segment of an experiment in ONE pass.

``analytics.report.aggregate.variant_stats`` answers one segment per query; over all segments
that scans ``segment_rollups`` once per segment (a segment is not selective enough for
the index to pay off). The report needs every segment, so this groups by
``(segment, variant)`` in a single scan, reusing ``aggregate``'s query plan (the same
shared-state ``regr_*`` sums) so the numbers are identical to ``variant_stats``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analytics.db import fetch_all
from analytics.report.aggregate import _REGR, _plan, _stats, isolated
from analytics.report.catalogue import Metric
from analytics.stats.sufficient import SampleStats

SegmentStats = dict[str, dict[str, dict[str, SampleStats]]]  # segment -> metric -> variant -> stats


def segment_stats(
    pg: Any, experiment_id: int, metrics: Sequence[Metric], failed: dict[str, str] | None = None
) -> tuple[SegmentStats, dict[str, int]]:
    """(segment -> metric -> variant -> SampleStats, segment -> units) for all segments.

    ``failed``: see ``analytics.report.aggregate.isolated``."""
    return isolated(pg, metrics, lambda ms: _segment_stats(pg, experiment_id, ms), failed)


def _segment_stats(
    pg: Any, experiment_id: int, metrics: Sequence[Metric]
) -> tuple[SegmentStats, dict[str, int]]:
    plan = _plan(metrics, False)
    cols = ", ".join(["count(*)", *(f"{f}({b}, {a})" for a, b in plan.pairs for f in _REGR)])
    sql = (
        f"SELECT r.segment, r.variant, {cols} FROM segment_rollups r"
        " WHERE r.experiment_id = %s GROUP BY r.segment, r.variant"
    )
    out: SegmentStats = {}
    units: dict[str, int] = {}
    k = len(_REGR)
    for row in fetch_all(pg, sql, [experiment_id]):
        segment, variant, n, values = str(row[0]), str(row[1]), int(row[2]), row[3:]
        pair_values = [values[i * k : (i + 1) * k] for i in range(len(plan.pairs))]
        per_metric = out.setdefault(segment, {name: {} for name in plan.fields})
        for name, roles in plan.fields.items():
            per_metric[name][variant] = _stats(n, roles, pair_values)
        units[segment] = units.get(segment, 0) + n
    return out, units
