"""The report's allocation table and sample-ratio check (SRM).

An A/B experiment's weights are fixed once it starts (the control plane refuses a change:
``control.config``), so every unit is tested against them. A rollout's
weights change at every stage, and the report spans all of them: comparing cumulative units
with the current weights raises a false mismatch at every ramp (a unit moved from the
control to the candidate even gets a second rollup row, first seen in the new stage). So a
rollout is tested **per stage, with that stage's weights**: the gateway tags every call of a
running rollout with ``rollout_stage=<index>`` from the same config snapshot as the weights
that assigned it, and ingest rolls tags up per unit (``segment_rollups``), so the units seen
in a stage are exactly the units assigned with the stage's weights. A stage is flagged at
p < threshold / k over the k stages tested (Bonferroni), which keeps the chance of a false
banner over a whole rollout at most ``threshold``.

Rollouts whose calls carry no stage tag fall back to the units whose *first* call, in any
variant, came after the current stage started (plus the gateway's refresh grace): each of
them was assigned with the current stage's weights and is counted once, where it was first
served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from analytics.report.comparison import error
from analytics.report.schema import AllocationRow, SrmCheck, SrmMethod, StageSrm
from analytics.stats.srm import SRM_THRESHOLD
from analytics.stats.srm import srm_check as srm_test
from contracts.events import ROLLOUT_STAGE_TAG

#: The gateway applies new weights within 1 s; units first seen this long after a stage
#: began were surely assigned with its weights (the controller's default grace, too).
STAGE_GRACE_S = 2.0

Variants = Sequence[tuple[str, float, bool]]  # name, weight, is_control
StageWeights = Mapping[int, Mapping[str, float]]


def allocation_rows(variants: Variants, counts: Mapping[str, int]) -> list[AllocationRow]:
    total_w = sum(w for _, w, _ in variants)
    total_n = sum(counts.get(n, 0) for n, _, _ in variants)
    return [
        AllocationRow(
            variant=n, is_control=c, expected_weight=w,
            expected_share=w / total_w if total_w > 0 else 0.0, observed_units=counts.get(n, 0),
            observed_share=counts.get(n, 0) / total_n if total_n else None,
        )
        for n, w, c in variants
    ]  # fmt: skip


def srm_all_units(
    variants: Variants, counts: Mapping[str, int], mode: str
) -> tuple[list[AllocationRow], SrmCheck]:
    """Every unit against the configured weights (A/B), or not applicable (shadow)."""
    rows = allocation_rows(variants, counts)
    if mode == "shadow":
        na = error("not_applicable", "shadow experiments serve every unit the control")
        return rows, SrmCheck(chi2=None, p_value=None, flagged=False, error=na)
    return rows, _check(variants, counts, "all_units")


def _check(variants: Variants, counts: Mapping[str, int], method: SrmMethod) -> SrmCheck:
    weights = {n: w for n, w, _ in variants}
    names = list(weights)
    stray = sum(v for k, v in counts.items() if k not in weights)
    if stray:
        # Units logged under a variant the experiment does not have: logging is broken.
        bad = error("unexpected_variant", f"{stray} units in variants the experiment does not define")
        return SrmCheck(
            chi2=None, p_value=0.0, flagged=True, threshold=SRM_THRESHOLD, method=method, error=bad
        )
    res = srm_test([counts.get(n, 0) for n in names], [weights[n] for n in names], SRM_THRESHOLD)
    err = error(str(res.error), res.message) if res.error is not None else None
    if err is None and res.message:
        err = error("unexpected_variant", res.message)
    return SrmCheck(
        chi2=res.chi2, p_value=res.p_value, flagged=res.flagged, threshold=SRM_THRESHOLD,
        method=method, error=err,
    )  # fmt: skip


def stage_srm(
    units: Mapping[int, Mapping[str, int]],
    weights: StageWeights,
    candidate: str | None = None,
    threshold: float = SRM_THRESHOLD,
) -> tuple[list[StageSrm], float | None]:
    """Each stage's units against its weights; (per-stage rows, Bonferroni-combined p).

    Pure: ``units`` and ``weights`` map a stage index to counts / weights per variant (a
    stage's ``percent`` is ``candidate``'s weight). A stage without known weights is
    listed with an error and not tested.
    """
    rows: list[StageSrm] = []
    tested: list[tuple[int, float]] = []
    for stage in sorted(units):
        counts = dict(units[stage])
        w = weights.get(stage)
        if w is None:
            rows.append(StageSrm(stage=stage, percent=None, units=counts, expected_share={}, chi2=None,
                                 p_value=None, flagged=False,
                                 error=error("unknown_weights", f"stage {stage} is not in the rollout plan")))  # fmt: skip
            continue
        total_w = sum(w.values())
        share = {n: (x / total_w if total_w > 0 else 0.0) for n, x in w.items()}
        stray = sum(v for k, v in counts.items() if k not in w)
        names = list(w)
        res = srm_test([counts.get(n, 0) for n in names], [w[n] for n in names], threshold)
        p = 0.0 if stray else res.p_value
        err = None
        if stray:
            err = error("unexpected_variant", f"{stray} units in variants the experiment does not define")
        elif res.error is not None:
            err = error(str(res.error), res.message)
        elif res.message:
            err = error("unexpected_variant", res.message)
        rows.append(StageSrm(stage=stage, percent=w.get(candidate) if candidate else None,
                             units=counts, expected_share=share, chi2=None if stray else res.chi2, p_value=p,
                             flagged=False, error=err))  # fmt: skip
        if p is not None:
            tested.append((len(rows) - 1, p))
    if not tested:
        return rows, None
    k = len(tested)
    for i, p in tested:
        rows[i] = rows[i].model_copy(update={"flagged": p < threshold / k})
    return rows, min(1.0, k * min(p for _, p in tested))


def stage_weights(control: str, candidate: str, stages: Sequence[float]) -> dict[int, dict[str, float]]:
    """Weights of every stage of a plan: the candidate gets the stage's percent."""
    return {i: {control: 100.0 - pct, candidate: pct} for i, pct in enumerate(stages)}


def stage_units(conn: Connection, experiment_id: int, stages: int) -> dict[int, dict[str, int]]:
    """Units per variant seen in each stage (``rollout_stage`` segments), stages 0..stages-1."""
    segments = [f"{ROLLOUT_STAGE_TAG}={i}" for i in range(stages)]
    rows = conn.execute(
        text(
            "SELECT segment, variant, count(*) FROM segment_rollups"
            " WHERE experiment_id = :e AND segment = ANY(:s) GROUP BY segment, variant"
        ),
        {"e": experiment_id, "s": segments},
    )
    out: dict[int, dict[str, int]] = {}
    for segment, variant, n in rows:
        out.setdefault(int(str(segment).partition("=")[2]), {})[str(variant)] = int(n)
    return out


def first_exposure_units(conn: Connection, experiment_id: int, since: datetime) -> dict[str, int]:
    """Units whose first call (in any variant) came at or after ``since``, under that variant."""
    rows = conn.execute(
        text(
            "SELECT variant, count(*) FROM (SELECT DISTINCT ON (unit_id) unit_id, variant, first_ts"
            " FROM unit_rollups WHERE experiment_id = :e ORDER BY unit_id, first_ts, variant) u"
            " WHERE first_ts >= :t GROUP BY variant"
        ),
        {"e": experiment_id, "t": since},
    )
    return {str(v): int(n) for v, n in rows}


def srm_rollout(
    conn: Connection,
    experiment_id: int,
    variants: Variants,
    stage: int | None,
    stage_started_at: datetime | None,
    weights: StageWeights,
    n_stages: int,
    grace_s: float = STAGE_GRACE_S,
) -> tuple[list[AllocationRow], SrmCheck]:
    """A rollout's allocation (the current stage) and its SRM, per stage (see module doc)."""
    per_stage = stage_units(conn, experiment_id, max(n_stages, (stage or 0) + 1))
    if per_stage:
        candidate = next((n for n, _, c in variants if not c), None)
        rows, p = stage_srm(per_stage, weights, candidate)
        current = stage if stage in per_stage else max(per_stage)
        shown = _variants_at(variants, weights.get(current))
        allocation = allocation_rows(shown, per_stage[current])
        err = None
        if p is None:
            err = next((r.error for r in rows if r.error is not None), None) or error("no_data")
        chi2 = next((r.chi2 for r in rows if r.stage == current), None)
        check = SrmCheck(
            chi2=chi2, p_value=p, flagged=any(r.flagged for r in rows), threshold=SRM_THRESHOLD,
            method="per_stage", stages=rows, error=err,
        )  # fmt: skip
        return allocation, check
    if stage_started_at is None:
        empty = error("no_data", "the rollout has not started a stage yet")
        return allocation_rows(variants, {}), SrmCheck(
            chi2=None, p_value=None, flagged=False, method="first_exposure", error=empty
        )
    shown = _variants_at(variants, None if stage is None else weights.get(stage))
    counts = first_exposure_units(conn, experiment_id, stage_started_at + timedelta(seconds=grace_s))
    return allocation_rows(shown, counts), _check(shown, counts, "first_exposure")


def _variants_at(variants: Variants, weights: Mapping[str, float] | None) -> list[tuple[str, float, bool]]:
    """The variants with a stage's weights (the configured ones when the stage is unknown)."""
    if weights is None:
        return list(variants)
    return [(n, weights.get(n, 0.0), c) for n, _, c in variants]
