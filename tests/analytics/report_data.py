"""Test data for report tests: experiments and per-unit rollups written with plain SQL.

Report logic is tested on rollups inserted directly (the ingest has its own tests), so
every expected number can be recomputed from the per-unit arrays kept here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Connection, text

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def create_experiment(
    conn: Connection,
    variants: Sequence[tuple[str, float]],
    *,
    mode: str = "ab",
    status: str = "running",
    metrics: Sequence[Any] = (),
    name: str | None = None,
    stage_started_at: datetime | None = None,
    segment_tags: Sequence[str] = ("task", "lang"),
) -> tuple[int, str]:
    """An experiment whose first variant is the control, declaring ``segment_tags``; returns (id, name)."""
    name = name or f"exp-{secrets.token_hex(4)}"
    up = conn.execute(
        text("INSERT INTO upstreams (name, base_url) VALUES (:n, 'http://127.0.0.1:1') RETURNING id"),
        {"n": f"up-{secrets.token_hex(4)}"},
    ).scalar_one()
    eid = int(
        conn.execute(
            text(
                "INSERT INTO experiments (name, route, mode, status, salt, metrics, started_at, stage_started_at,"
                " segment_tags) VALUES (:n, :r, :m, :s, 'salt', CAST(:metrics AS jsonb), :t, :st, :tags) RETURNING id"
            ),
            {"n": name, "r": f"route-{name}", "m": mode, "s": status, "metrics": orjson.dumps(list(metrics)).decode(),
             "t": T0, "st": stage_started_at, "tags": list(segment_tags)},
        ).scalar_one()
    )  # fmt: skip
    for i, (vname, weight) in enumerate(variants):
        conn.execute(
            text(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (:e, :n, :u, 'm', :w, :c)"
            ),
            {"e": eid, "n": vname, "u": up, "w": weight, "c": i == 0},
        )
    return eid, name


@dataclass
class Units:
    """Per-unit measures of one variant (one array per rollup column)."""

    columns: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, key: str) -> np.ndarray:
        return self.columns[key]


def simulate_units(
    rng: np.random.Generator, n: int, *, thumbs_p: float, tokens: float, error_p: float
) -> Units:
    requests = rng.poisson(3.0, n) + 1.0
    thumbs = rng.binomial(requests.astype(int), thumbs_p).astype(float)
    return Units(
        {
            "requests": requests,
            "thumbs_up": thumbs,
            "errors": rng.binomial(requests.astype(int), error_p).astype(float),
            "completion_tokens": requests * tokens * rng.gamma(4.0, 0.25, n),
            "prompt_tokens": requests * 20.0,
            "latency_sum": requests * rng.gamma(5.0, 60.0, n),
        }
    )


def insert_units(
    conn: Connection,
    experiment_id: int,
    variant: str,
    units: Units,
    *,
    segment: str = "",
    prefix: str | None = None,
    first_ts: datetime = T0,
) -> None:
    cols = list(units.columns)
    prefix = prefix or variant
    rows = [
        {
            "e": experiment_id,
            "v": variant,
            "s": segment,
            "u": f"{prefix}-{i}",
            "t": first_ts + timedelta(seconds=i),
        }
        | {c: float(units.columns[c][i]) for c in cols}
        for i in range(units.n)
    ]
    if not rows:
        return
    names = ", ".join(cols)
    values = ", ".join(f":{c}" for c in cols)
    # Tag segments live in their own table; the whole experiment in unit_rollups.
    table, seg_col, seg_val = (
        ("segment_rollups", "segment, ", ":s, ") if segment else ("unit_rollups", "", "")
    )
    conn.execute(
        text(
            f"INSERT INTO {table} (experiment_id, variant, {seg_col}unit_id, first_ts, last_ts, {names})"
            f" VALUES (:e, :v, {seg_val}:u, :t, :t, {values})"
        ),
        rows,
    )


def insert_histogram(
    conn: Connection,
    experiment_id: int,
    variant: str,
    metric: str,
    counts: Mapping[int, int],
    segment: str = "",
) -> None:
    conn.execute(
        text(
            "INSERT INTO latency_histograms (experiment_id, variant, metric, segment, bucket, count)"
            " VALUES (:e, :v, :m, :s, :b, :c)"
        ),
        [
            {"e": experiment_id, "v": variant, "m": metric, "s": segment, "b": b, "c": c}
            for b, c in counts.items()
        ],
    )
