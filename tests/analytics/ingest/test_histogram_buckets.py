"""One histogram bucket rule: the database (ingest) and Python (report, statistics) agree."""

from __future__ import annotations

import math
import random

from sqlalchemy import text
from sqlalchemy.orm import Session

from analytics.ingest import rollups
from analytics.report import aggregate
from analytics.stats.quantile import BUCKETS_PER_E, MIN_BUCKETED, bucket_of


def _values() -> list[float]:
    out = [0.0, 1e-300, 0.001, math.nextafter(MIN_BUCKETED, 0), MIN_BUCKETED, 0.0101, 1.0, 1e9]
    for k in range(-92, 320):  # every bucket boundary from 0.01 ms to ~9 hours, and its neighbours
        b = math.exp(k / BUCKETS_PER_E)
        out += [b, math.nextafter(b, 0), math.nextafter(b, math.inf)]
    rng = random.Random(7)
    return out + [rng.lognormvariate(4, 2) for _ in range(5_000)]


def test_postgres_puts_every_value_in_the_bucket_python_computes(db: Session) -> None:
    values = _values()
    stored = (
        db.execute(
            text(
                f"SELECT {rollups.bucket_sql('v')} FROM unnest(CAST(:vs AS float8[])) WITH ORDINALITY t(v, i)"
                " ORDER BY i"
            ),
            {"vs": values},
        )
        .scalars()
        .all()
    )
    mismatched = [(v, s, bucket_of(v)) for v, s in zip(values, stored, strict=True) if s != bucket_of(v)]
    assert mismatched == []


def test_the_one_fold_and_the_report_use_the_one_rule() -> None:
    assert rollups.bucket_sql("latency_ms").encode() in rollups.HISTOGRAMS
    assert aggregate.bucket_of is bucket_of
    assert bucket_of(0.0) == bucket_of(MIN_BUCKETED) == math.floor(math.log(MIN_BUCKETED) * BUCKETS_PER_E)
