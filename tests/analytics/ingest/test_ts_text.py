"""copy_text.ts_text: the COPY path's timestamp text is the instant PostgreSQL's to_timestamp gives."""

from __future__ import annotations

import random

import pytest

from analytics.ingest import copy_text
from tests.analytics.ingest_helpers import connect


def _values() -> list[float]:
    rng = random.Random(7)
    out = [rng.uniform(0, 4.1e9) for _ in range(3000)]  # 1970-2100, random fractions
    out += [round(rng.uniform(1.6e9, 1.9e9), 6) for _ in range(1000)]  # microsecond-exact decimals
    base = 946_684_800
    out += [base + k / 1e6 + 0.5e-6 for k in range(-50, 50)]  # near half-microsecond ties
    out += [
        0.0, -0.0, 1.0, -1.5, -0.0000005, 0.0000005, 1.9999995, 1.9999994999, 0.9999996,
        base, base - 1e-6, base + 0.5e-6, -62_135_596_800.0, 253_402_300_799.0,
        -86_400 * 365 * 50.25, 1_764_486_000.123456, 1_764_486_000.1234565,
    ]  # fmt: skip
    return [float(v) for v in out]


def test_the_text_parses_to_the_same_instant_as_to_timestamp(database_url: str) -> None:
    values = _values()
    texts = [copy_text.ts_text(v) for v in values]
    with connect(database_url) as conn:
        rows = conn.execute(
            "SELECT i, a, to_timestamp(b)::text FROM unnest(%s::text[], %s::float8[]) WITH ORDINALITY"
            " AS x(a, b, i) WHERE a::timestamptz IS DISTINCT FROM to_timestamp(b)",
            (texts, values),
        ).fetchall()
    assert rows == [], [(values[int(i) - 1], a, b) for i, a, b in rows[:5]]


def test_the_cache_gives_the_same_text_and_is_bounded() -> None:
    first = [copy_text.ts_text(t) for t in (1_764_486_000.25, 1_764_486_000.75, 1_764_486_001.0)]
    assert first == [
        "2025-11-30 07:00:00.250000+00",
        "2025-11-30 07:00:00.750000+00",
        "2025-11-30 07:00:01.000000+00",
    ]
    for s in range(100_050):
        copy_text.ts_text(float(s))
    assert len(copy_text._SECOND_TEXT) <= 100_000
    assert copy_text.ts_text(1_764_486_000.25) == first[0]
    assert copy_text.ts_text(-0.5) == "1969-12-31 23:59:59.500000+00"


@pytest.mark.parametrize("t", [float("nan"), float("inf"), float("-inf"), 1e300, 253_402_300_800.0, -1e12])
def test_values_outside_datetimes_range_are_unsupported(t: float) -> None:
    with pytest.raises(copy_text.Unsupported):
        copy_text.ts_text(t)
