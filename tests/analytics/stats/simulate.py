"""Shared helpers for the statistics tests: vectorised sufficient statistics, JSON safety."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analytics.stats import SampleStats

Array = NDArray[np.float64]


def stats_rows(x: Array, y: Array | None = None, c: Array | None = None) -> list[SampleStats]:
    """One SampleStats per row of ``x`` (units along the last axis), as SQL would sum them."""
    x = np.atleast_2d(x).astype(np.float64)
    zero = np.zeros_like(x)
    yy = zero if y is None else np.atleast_2d(y).astype(np.float64)
    cc = zero if c is None else np.atleast_2d(c).astype(np.float64)
    cols = (
        x.sum(-1),
        (x * x).sum(-1),
        yy.sum(-1),
        (yy * yy).sum(-1),
        (x * yy).sum(-1),
        cc.sum(-1),
        (cc * cc).sum(-1),
        (x * cc).sum(-1),
        (yy * cc).sum(-1),
    )
    n = x.shape[-1]
    return [SampleStats(n, *(float(col[i]) for col in cols)) for i in range(x.shape[0])]


def stats_from_sums(n: Array, sums: dict[str, Array]) -> list[SampleStats]:
    """SampleStats from already-summed columns (names as SampleStats fields)."""
    out = []
    for i in range(len(n)):
        out.append(SampleStats(n=int(n[i]), **{k: float(v[i]) for k, v in sums.items()}))
    return out


def assert_json_safe(result: Any) -> None:
    """No NaN/inf anywhere in a result dataclass; it serialises to strict JSON."""
    data = dataclasses.asdict(result)

    def walk(v: Any) -> None:
        if isinstance(v, float):
            assert math.isfinite(v), f"non-finite value in {result!r}"
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, list | tuple):
            for item in v:
                walk(item)

    walk(data)
    json.dumps(data, allow_nan=False)
