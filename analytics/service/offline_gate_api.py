"""``GET /api/experiments/{id_or_name}/offline-gate``: the offline gate of one experiment.

The declaration, per candidate the newest gate decision with its per-category evidence and
the rollout hook's answer now, the category × variant matrix of the newest runs (pass rate
with a Wilson 95% interval per cell), and the items a candidate failed that the baseline
passed, with both outputs (``?items=N&offset=M``, N ≤ 100). Read access, like the report;
404 for an unknown experiment. An experiment with no run or decision answers the same shape
with empty lists and nulls. The document is built by :mod:`analytics.report.offline_gate`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from analytics.report import offline_gate
from analytics.service.api import Ctx, resolve_experiment

router = APIRouter()


@router.get("/api/experiments/{id_or_name}/offline-gate")
def get_offline_gate(
    ctx: Ctx,
    id_or_name: str,
    items: Annotated[int, Query(ge=0, le=offline_gate.MAX_ITEMS)] = offline_gate.DEFAULT_ITEMS,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        return offline_gate.view(conn, eid, limit=items, offset=offset)
