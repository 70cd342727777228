"""The report's RL-risks section: the RL-risk rollup, judgements and stored responses → the
pure detectors of :mod:`analytics.risks` → :class:`~analytics.report.risks_schema.RlRisks`.

What is read, and what bounds the cost (``docs/rl-risks.md``, ``bench/report/README.md``):

* ``rl_rollups`` (appended at ingest by ``analytics.ingest.rollups``: per unit, category and
  length bin, the responses, completion tokens and counted thumbs: a row per counted
  response and per counted thumb, compacted in the background into a row per key, summed
  here). One pass groups it per unit and sums per arm the sufficient statistics of the
  category mix, the capability matrix and the length shift: every unit, in a few rows out.
* The length decomposition's unit-clustered bootstrap reads its cells (unit × category ×
  length bin) of a hash sample of units, at most about ``max_units`` (``units_share``).
* The judge part reads judged responses one by one (score, category, outcome) for a hash
  sample of units, at most about ``max_judged`` responses (``judge.judged_share``).
* Phrases read the most recent ``max_phrase_responses`` stored response texts per arm
  (content logging ``full``/``redacted``).

The user outcome of a response (``satisfaction``) is its thumbs-up minus its thumbs-down
(each counted once per response, the first with a value > 0): +1, 0 (no vote) or −1. The
capability matrix tests the thumbs-up rate, the thumbs-down rate and satisfaction per
category (ratio metrics per unit: a unit's sum over its responses of that category / its
responses of that category).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse
from sqlalchemy import Connection, text

from analytics.ingest.rollups import RL_ROWS
from analytics.report.risks_schema import (
    CapabilityPart,
    CategoryGuardrailRow,
    CategoryMixPart,
    CategoryShareRow,
    CurvePoint,
    DecompositionOut,
    JudgePart,
    MatrixCellRow,
    PhrasePart,
    PhraseRow,
    RiskAlarm,
    RiskEvidence,
    RiskState,
    RlRisks,
    VerbosityPart,
)
from analytics.risks import (
    Cells,
    Decomposition,
    Evidence,
    Guardrail,
    MatrixInput,
    MixStats,
    PairMoments,
    PhraseArm,
    capability_matrix,
    category_mix,
    judge_divergence,
    stuffed_phrases,
    verbosity,
)
from analytics.risks.curve import score_bin
from analytics.stats import DEFAULT_PLANNED_UNITS, Direction, ErrorCode, MetricKind, SampleStats
from contracts.ngrams import TEXT_MAX, grams, hash_label
from contracts.tables import LENGTH_BINS_PER_DOUBLING

#: The user outcome of the decomposition and judge parts.
OUTCOME = "satisfaction"
#: Capability-matrix metrics: name → (direction, the per-response column it sums).
MATRIX_METRICS: dict[str, tuple[Direction, str]] = {
    "thumbs_down_rate": (Direction.DECREASE, "down"),
    "thumbs_up_rate": (Direction.INCREASE, "up"),
    OUTCOME: (Direction.INCREASE, "y"),
}
SCORE_BINS = 10
_INSUFFICIENT = {ErrorCode.TOO_FEW_UNITS, ErrorCode.EMPTY_VARIANT, ErrorCode.ZERO_VARIANCE, ErrorCode.NO_DATA}
_MAX_TEXT = TEXT_MAX  # characters of a response tokenised for phrases


@dataclass(frozen=True, slots=True)
class RiskOptions:
    alpha: float = 0.05
    planned_units: int = DEFAULT_PLANNED_UNITS
    min_units: int = 30  # per arm, for any part to be tested
    guardrails: tuple[Guardrail, ...] = ()  # per-category guardrails (a rollout plan's)
    score_min: float = 1.0  # the judge's score range (bins of the calibration curve)
    score_max: float = 10.0
    replicates: int = 200
    max_phrase_responses: int = 5000  # per arm
    phrase_top: int = 20
    min_phrase_responses: int = 10
    seed: int = 0
    # Above this many units the detectors read a random subset of units (by a hash of the
    # unit id, the same for both arms): the cost stays bounded, every test stays valid.
    max_units: int = 100_000
    # The judge part reads at most about this many judged responses (a smaller unit sample).
    max_judged: int = 200_000
    # Hashed n-grams (content logging ``hashed``): read the rows made with this key (None: the
    # key of the newest row), and show the text of hashes this lookup resolves.
    ngram_key_id: str | None = None
    phrase_lookup: Mapping[int, str] = field(default_factory=dict)


#: The rollup the detectors read: ``rl_rollups`` (folded at ingest), or the same relation
#: computed from the stored rows (``rows=True``: the per-row definition, for checks).
_ROLLUPS = "rl_rollups"
_ROWS = f"({RL_ROWS})"
_WORK_MEM = "256MB"
#: Above this many categories the per-unit pivot (3 columns per category) would exceed
#: PostgreSQL's column limit; the gateway assigns at most 64 rule categories and ``other``.
MAX_CATEGORIES = 400

_CATEGORIES = (
    "SELECT DISTINCT category FROM {src} r WHERE r.experiment_id = :e AND r.variant = ANY(:variants)"
)


def _pivot_sql(src: str, k: int) -> str:
    """One pass over the experiment's rollup rows: per unit (GROUP BY variant, unit) its
    responses, tokens and, per category c0..c{k-1}, responses / thumbs up / thumbs down;
    then per variant the sums over units the detectors' sufficient statistics need: six
    scalars, 12 per category (an array) and the K(K−1)/2 cross-products of the mix (an
    array: any number of categories stays within PostgreSQL's column limit).

    Units are grouped by a 64-bit hash of their id (``_CELLS``): a sort or hash of integers,
    not of collated text, and no index-ordered walk of the heap (rows are stored in arrival
    order: an index scan in key order read 2.7M pages at 10M interactions)."""
    per_unit = ["sum(responses) AS n", "sum(tokens) AS t"]
    per_category: list[str] = []
    cross: list[str] = []
    for i in range(k):
        per_unit += [f"sum({c}) FILTER (WHERE category = :c{i}) AS {a}{i}"
                     for c, a in (("responses", "n"), ("thumbs_up", "u"), ("thumbs_down", "d"))]  # fmt: skip
        per_category += [f"count(n{i})", f"sum(n{i})", f"sum(n{i} * n{i})"]
        for x in (f"u{i}", f"d{i}", f"(u{i} - d{i})"):
            per_category += [f"sum({x})", f"sum({x} * {x})", f"sum({x} * n{i})"]
        cross += [f"sum(coalesce(n{i}, 0) * coalesce(n{j}, 0))" for j in range(i + 1, k)]
    return f"""
    WITH u AS (
        SELECT variant, {", ".join(per_unit)}
        FROM {src} r WHERE r.experiment_id = :e AND r.variant = ANY(:variants)
        GROUP BY variant, hashtextextended(unit_id, 0)
    )
    SELECT variant, count(*), sum(n), sum(n * n), sum(t), sum(t * t), sum(t * n),
           ARRAY[{", ".join(per_category)}]::float8[], ARRAY[{", ".join(cross) or "NULL"}]::float8[]
    FROM u GROUP BY variant
    """


# The cells of the length decomposition: one row per (unit, category, length bin), of a
# hash sample of units (the same units in every arm); unit ids as 64-bit hashes (dense
# codes in Python; a collision among a million units has probability ~3e-8). rl_rollups
# holds a row per counted response and per counted thumb (appended at ingest) until the
# compaction sums them into a row per key: summed here either way.
_CELLS = """
SELECT variant, hashtextextended(unit_id, 0) AS uh, category, lbin, sum(responses), sum(thumbs_up - thumbs_down)
FROM {src} r WHERE r.experiment_id = :e AND r.variant = ANY(:variants)
  AND (:ppm >= 1000000 OR (hashtext(unit_id) & 2147483647) % 1000000 < :ppm)
GROUP BY variant, uh, category, lbin HAVING sum(responses) > 0
"""

# Judged responses (a hash sample of units, bounded): the judge score (mean over judges),
# the response's category and its outcome (counted thumbs: the first with a value > 0).
_JUDGED = text(
    """
    WITH j AS (
        SELECT request_id, avg(score) AS score
        FROM judgements
        WHERE experiment_id = :e AND role = 'primary' AND status = 'ok' AND score IS NOT NULL
          AND (:ppm >= 1000000 OR (hashtext(unit_id) & 2147483647) % 1000000 < :ppm)
        GROUP BY request_id
    )
    SELECT i.variant, hashtextextended(i.unit_id, 0), coalesce(i.category, 'other'), j.score,
           (EXISTS (SELECT 1 FROM feedback f WHERE f.request_id = j.request_id AND f.experiment_id = :e
                      AND f.kind = 'thumbs_up' AND f.value > 0))::int
         - (EXISTS (SELECT 1 FROM feedback f WHERE f.request_id = j.request_id AND f.experiment_id = :e
                      AND f.kind = 'thumbs_down' AND f.value > 0))::int
    FROM j CROSS JOIN LATERAL (
        SELECT x.variant, x.unit_id, x.category
        FROM (SELECT * FROM interactions y WHERE y.request_id = j.request_id OFFSET 0) x
        WHERE x.experiment_id = :e AND x.role = 'primary' AND x.status = 'ok' AND x.variant = ANY(:variants)
        LIMIT 1) i
    """
)
_JUDGED_COUNT = text(
    "SELECT count(*) FROM judgements WHERE experiment_id = :e AND role = 'primary' AND status = 'ok'"
)

_TEXTS = text(
    """
    WITH r AS (
        SELECT request_id, unit_id, coalesce(category, 'other') AS category, response
        FROM interactions
        WHERE experiment_id = :e AND variant = :v AND role = 'primary' AND status = 'ok'
          AND response IS NOT NULL
        ORDER BY ts DESC LIMIT :n
    )
    SELECT r.unit_id, r.category, left(r.response, :chars),
           (SELECT coalesce(max((kind = 'thumbs_up')::int), 0) - coalesce(max((kind = 'thumbs_down')::int), 0)
              FROM feedback f WHERE f.request_id = r.request_id AND f.experiment_id = :e
               AND kind IN ('thumbs_up', 'thumbs_down')),
           (SELECT avg(score) FROM judgements j WHERE j.request_id = r.request_id AND j.experiment_id = :e
               AND j.role = 'primary' AND j.status = 'ok')
    FROM r
    """
)


@dataclass(frozen=True, slots=True)
class _Arm:
    """One arm's sums over its units (``_pivot_sql``): the sufficient statistics of the
    category mix, the capability matrix and the length shift."""

    units: int
    length: SampleStats  # per unit: completion tokens / responses (a ratio metric)
    mix: MixStats
    ratio: dict[tuple[str, str], SampleStats]  # (category, "up"|"down"|"y") → Σ over units in it


@dataclass(frozen=True, slots=True)
class _Totals:
    categories: tuple[str, ...]
    arms: dict[str, _Arm]

    def arm(self, variant: str) -> _Arm:
        k = len(self.categories)
        empty = _Arm(0, SampleStats(0, 0.0, 0.0), MixStats(0, (0.0,) * k, ((0.0,) * k,) * k), {})
        return self.arms.get(variant, empty)


def _f(v: Any) -> float:
    return float(v) if v is not None else 0.0


def _parse_arm(row: Sequence[Any], categories: tuple[str, ...]) -> _Arm:
    units, n, nn, t, tt, tn = (_f(v) for v in row[1:7])
    per_category, pairs = list(row[7]), iter(row[8])
    k = len(categories)
    sums = [0.0] * k
    cross = [[0.0] * k for _ in range(k)]
    ratio: dict[tuple[str, str], SampleStats] = {}
    for i, c in enumerate(categories):
        vals = [_f(v) for v in per_category[12 * i : 12 * (i + 1)]]
        units_i, n_i, nn_i = int(vals[0]), vals[1], vals[2]
        for m, col in enumerate(("up", "down", "y")):
            x, xx, xn = vals[3 + 3 * m : 6 + 3 * m]
            ratio[(c, col)] = SampleStats(units_i, x, xx, n_i, nn_i, xn)
        sums[i] = n_i
        cross[i][i] = nn_i
        for j in range(i + 1, k):
            cross[i][j] = cross[j][i] = _f(next(pairs))
    mix = MixStats(int(units), tuple(sums), tuple(tuple(r) for r in cross))
    return _Arm(int(units), SampleStats(int(units), t, tt, n, nn, tn), mix, ratio)


def _load_totals(conn: Connection, eid: int, variants: Sequence[str], src: str) -> _Totals:
    params: dict[str, Any] = {"e": eid, "variants": list(variants)}
    categories = tuple(sorted(r[0] for r in conn.execute(text(_CATEGORIES.format(src=src)), params)))
    if len(categories) > MAX_CATEGORIES:
        raise TooManyCategories(len(categories))
    if not categories:
        return _Totals((), {})
    params |= {f"c{i}": c for i, c in enumerate(categories)}
    # One hash table of a million units fits in ~250 MB: granted to this statement only
    # (PostgreSQL spills to disk beyond work_mem, so memory stays bounded either way).
    previous = conn.execute(text("SELECT current_setting('work_mem')")).scalar_one()
    conn.execute(text("SELECT set_config('work_mem', :m, true)"), {"m": _WORK_MEM})
    try:
        rows = conn.execute(text(_pivot_sql(src, len(categories))), params).all()
    finally:
        conn.execute(text("SELECT set_config('work_mem', :m, true)"), {"m": previous})
    return _Totals(categories, {r[0]: _parse_arm(r, categories) for r in rows})


class TooManyCategories(ValueError):
    def __init__(self, k: int) -> None:
        super().__init__(f"{k} task categories: the detectors handle at most {MAX_CATEGORIES}")


@dataclass(frozen=True, slots=True, eq=False)
class _Sample:
    """Per-row arrays of a unit sample (cells or judged responses): ``arm`` 0 control, 1
    candidate; ``unit`` dense codes over both arms; ``category`` codes into ``categories``."""

    arm: np.ndarray
    unit: np.ndarray
    category: np.ndarray
    bin: np.ndarray
    n: np.ndarray
    y: np.ndarray
    x: np.ndarray  # the judge score (judged responses); empty for cells


def _sample(rows: Sequence[Any], control: str, candidate: str, bins: Any) -> _Sample:
    """Rows (variant, unit hash, category, bin-or-score, n, y) of the two arms → arrays."""
    rows = [r for r in rows if r[0] in (control, candidate)]
    if not rows:
        e = np.zeros(0, dtype=np.int64)
        return _Sample(e, e, e, e, np.zeros(0), np.zeros(0), np.zeros(0))
    variant, uh, cat, b, n, y = zip(*rows, strict=True)
    arm = (np.array(variant, dtype=object) == candidate).astype(np.int64)
    _, unit = np.unique(np.array(uh, dtype=np.int64), return_inverse=True)
    _, category = np.unique(np.array(cat, dtype=object).astype(str), return_inverse=True)
    raw = np.array(b, dtype=float)
    return _Sample(arm, unit.reshape(-1).astype(np.int64), category.reshape(-1).astype(np.int64),
                   bins(raw), np.array(n, dtype=float), np.array(y, dtype=float), raw)  # fmt: skip


def _ratio_stats(x: np.ndarray, y: np.ndarray) -> SampleStats:
    return SampleStats(len(x), float(x.sum()), float(x @ x), float(y.sum()), float(y @ y), float(x @ y))


def _ev(e: Evidence | None) -> RiskEvidence | None:
    if e is None:
        return None
    return RiskEvidence(
        estimate=e.estimate, std_error=e.std_error, lower=e.lower, upper=e.upper,
        lower_one_sided=e.lower_one_sided, upper_one_sided=e.upper_one_sided, p_above=e.p_above,
        p_below=e.p_below,
    )  # fmt: skip


def _dec(d: Decomposition) -> DecompositionOut:
    return DecompositionOut(
        control_mean=d.control_mean, candidate_mean=d.candidate_mean, predicted_candidate=d.predicted_candidate,
        explained=d.explained, total=_ev(d.total), residual=_ev(d.residual), units=d.units,
        responses_control=d.responses_control, responses_candidate=d.responses_candidate,
        borrowed_share=d.borrowed_share,
    )  # fmt: skip


def _state_of(code: ErrorCode | None) -> RiskState:
    if code is None:
        return "ok"
    return "insufficient_data" if code in _INSUFFICIENT else "error"


def _too_few(n_c: int, n_t: int, need: int, what: str = "units") -> str | None:
    if min(n_c, n_t) >= need:
        return None
    return f"{n_c} control and {n_t} candidate {what}; the tests need at least {need} per arm"


# --- parts ---------------------------------------------------------------------------------


def _mix(tot: _Totals, arms: tuple[_Arm, _Arm], opts: RiskOptions) -> CategoryMixPart:
    if (why := _too_few(arms[0].units, arms[1].units, opts.min_units)) is not None:
        return CategoryMixPart(state="insufficient_data", reason=why)
    res = category_mix(tot.categories, arms[0].mix, arms[1].mix)
    shares = [
        CategoryShareRow(category=s.category, control=s.control, candidate=s.candidate,
                         difference=s.difference, std_error=s.std_error)
        for s in res.shares
    ]  # fmt: skip
    return CategoryMixPart(
        state=_state_of(res.error), reason=res.message, flagged=res.flagged, p_value=res.p_value,
        chi2=res.chi2, dof=res.dof, threshold=res.threshold, shares=shares,
    )  # fmt: skip


def _capability(tot: _Totals, arms: tuple[_Arm, _Arm], opts: RiskOptions) -> CapabilityPart:
    metrics = list(MATRIX_METRICS)
    inputs: list[MatrixInput] = []
    skipped: list[MatrixCellRow] = []
    empty = SampleStats(0, 0.0, 0.0)
    for category in tot.categories:
        for metric in metrics:
            direction, col = MATRIX_METRICS[metric]
            sc, st = (a.ratio.get((category, col), empty) for a in arms)
            if (why := _too_few(sc.n, st.n, opts.min_units)) is not None:
                skipped.append(
                    MatrixCellRow(
                        category=category, metric=metric, direction=direction.value, state="insufficient_data",
                        reason=why, n_control=sc.n, n_candidate=st.n,
                        control_mean=sc.sum_x / sc.sum_y if sc.sum_y > 0 else None,
                        candidate_mean=st.sum_x / st.sum_y if st.sum_y > 0 else None,
                    )
                )  # fmt: skip
                continue
            inputs.append(MatrixInput(category, metric, direction, MetricKind.RATIO, sc, st))
    matrix = capability_matrix(inputs, opts.guardrails, opts.alpha, opts.planned_units)
    cells = [
        MatrixCellRow(
            category=c.category, metric=c.metric, direction=c.direction.value, state=_state_of(c.error),
            reason=c.message, n_control=c.n_control, n_candidate=c.n_candidate, control_mean=c.control_mean,
            candidate_mean=c.candidate_mean, lift=c.lift, lift_std_error=c.lift_std_error,
            p_value_harm=c.p_value_harm, p_holm=c.p_holm, q_value=c.q_value, harmed=c.harmed,
            shrunk_lift=c.shrunk_lift, shrunk_std_error=c.shrunk_std_error,
        )
        for c in matrix.cells
    ]  # fmt: skip
    order = {m: i for i, m in enumerate(metrics)}
    cells = sorted(cells + skipped, key=lambda c: (order[c.metric], c.category))
    guards = [
        CategoryGuardrailRow(
            metric=c.metric, category=c.category, margin=c.margin, relative=c.relative, state=_state_of(c.error),
            reason=c.message, harm=c.harm, harm_lower=c.harm_lower, p_value=c.p_value, p_holm=c.p_holm,
            breached=c.breached,
        )
        for c in matrix.guardrails
    ]  # fmt: skip
    # A declared guardrail on a category too small to test is reported, never passed.
    for gr in opts.guardrails:
        for row in skipped:
            if row.metric == gr.metric:
                guards.append(
                    CategoryGuardrailRow(metric=gr.metric, category=row.category, margin=gr.margin,
                                         relative=gr.relative, state="insufficient_data", reason=row.reason)
                )  # fmt: skip
    state: RiskState = "ok" if inputs else "insufficient_data"
    reason = None if inputs else "no category has enough units in both arms yet"
    return CapabilityPart(
        state=state, reason=reason, metrics=metrics, categories=list(tot.categories), cells=cells,
        guardrails=sorted(guards, key=lambda r: (r.metric, r.category)),
        harmed=[f"{m}/{c}" for m, c in matrix.harmed_categories],
        breached=[f"{m}/{c}" for m, c in matrix.breached],
    )  # fmt: skip


def _curve(s: _Sample, edges: Any) -> list[CurvePoint]:
    """Mean outcome per bin and arm, pooled over categories (the chart's points)."""
    out = []
    for b in np.unique(s.bin).tolist():
        if b < 0:
            continue
        vals = []
        for a in (0, 1):
            m = (s.arm == a) & (s.bin == b)
            nn, yy = float(s.n[m].sum()), float(s.y[m].sum())
            vals.append((int(nn), yy / nn if nn > 0 else None))
        low, high = edges(b)
        out.append(CurvePoint(bin=int(b), low=low, high=high, control_n=vals[0][0], control_outcome=vals[0][1],
                              candidate_n=vals[1][0], candidate_outcome=vals[1][1]))  # fmt: skip
    return out


def _length_edges(b: int) -> tuple[float, float]:
    return 2 ** (b / LENGTH_BINS_PER_DOUBLING) - 1, 2 ** ((b + 1) / LENGTH_BINS_PER_DOUBLING) - 1


def _cells(s: _Sample) -> Cells:
    return Cells(s.unit, s.arm, s.category, s.bin, s.n, s.y)


def _verbosity(arms: tuple[_Arm, _Arm], cells: _Sample, opts: RiskOptions) -> VerbosityPart:
    if (why := _too_few(arms[0].units, arms[1].units, opts.min_units)) is not None:
        return VerbosityPart(state="insufficient_data", reason=why, outcome=OUTCOME)
    res = verbosity(arms[0].length, arms[1].length, _cells(cells), opts.alpha, opts.planned_units,
                    replicates=opts.replicates, seed=opts.seed)  # fmt: skip
    sh, dec = res.length, res.decomposition
    error = sh.error or dec.error
    return VerbosityPart(
        state=_state_of(error), reason=sh.message or dec.message, outcome=OUTCOME, tokens_control=sh.control,
        tokens_candidate=sh.candidate, shift=_ev(sh.shift), relative_shift=sh.relative, longer=sh.longer,
        decomposition=_dec(dec), gain_is_length=res.gain_is_length, no_gain=res.no_gain, alarm=res.alarm,
        curve=_curve(cells, _length_edges),
    )  # fmt: skip


def _judges(conn: Connection, eid: int) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT DISTINCT judge FROM judgements WHERE experiment_id = :e AND status = 'ok' ORDER BY 1 LIMIT 20"
        ),
        {"e": eid},
    )
    return [r[0] for r in rows]


def _judged_share(conn: Connection, eid: int, share: float, opts: RiskOptions) -> float:
    """The unit share the judge part reads: the section's, lowered so that about
    ``max_judged`` judged responses are read at most."""
    judged = conn.execute(_JUDGED_COUNT, {"e": eid}).scalar() or 0
    return min(share, opts.max_judged / judged) if judged else share


def _judge(conn: Connection, eid: int, judged: _Sample, share: float, opts: RiskOptions) -> JudgePart:
    masks = [judged.arm == 0, judged.arm == 1]
    counts = [int(m.sum()) for m in masks]
    base: dict[str, Any] = {"outcome": OUTCOME, "judged_control": counts[0], "judged_candidate": counts[1],
                            "judged_share": share}  # fmt: skip
    if counts[0] + counts[1] == 0:
        return JudgePart(
            state="unavailable", reason="no judge scores: configure the gateway's judge sampler", **base
        )
    base["judges"] = _judges(conn, eid)
    means = [float(judged.x[m].mean()) if c else None for m, c in zip(masks, counts, strict=True)]
    base |= {"mean_score_control": means[0], "mean_score_candidate": means[1]}
    units = [len(np.unique(judged.unit[m])) for m in masks]
    if (why := _too_few(units[0], units[1], opts.min_units, "units with judged responses")) is not None:
        return JudgePart(state="insufficient_data", reason=why, **base)
    cells = Cells.from_responses(judged.unit, judged.arm, judged.category, judged.bin, judged.y)
    pairs = [PairMoments.from_responses(judged.unit[m], judged.x[m], judged.y[m]) for m in masks]
    res = judge_divergence(
        cells, (pairs[0], pairs[1]), opts.alpha, opts.planned_units, opts.replicates, opts.seed
    )
    corr = res.correlation
    dec = res.decomposition
    width = (opts.score_max - opts.score_min) / SCORE_BINS

    def edges(b: int) -> tuple[float, float]:
        return opts.score_min + b * width, opts.score_min + (b + 1) * width

    return JudgePart(
        state=_state_of(dec.error), reason=dec.message, judge_says=res.judge_says, users_say=res.users_say,
        summary=res.summary, divergence=_ev(res.divergence), diverged=res.diverged, decomposition=_dec(dec),
        correlation_control=corr.control if corr else None, correlation_candidate=corr.candidate if corr else None,
        correlation_drop=_ev(corr.drop) if corr else None, correlation_dropped=bool(corr and corr.dropped),
        alarm=res.alarm, curve=_curve(judged, edges), **base,
    )  # fmt: skip


def ngrams(text_: str) -> set[str]:
    """Word 1–3-grams of a response: the tokenisation of the gateway's hashed n-grams and of
    an operator's phrase list (:mod:`contracts.ngrams`), so the two sources agree."""
    return grams(text_)


@dataclass(frozen=True, slots=True)
class _Texts:
    unit: list[str]
    category: list[str]
    grams: list[set[Any]]  # gram texts, or their keyed hashes (content logging hashed)
    y: np.ndarray
    score: np.ndarray  # NaN: not judged


def _load_texts(conn: Connection, eid: int, variant: str, opts: RiskOptions) -> _Texts:
    rows = conn.execute(
        _TEXTS, {"e": eid, "v": variant, "n": opts.max_phrase_responses, "chars": _MAX_TEXT}
    ).all()
    return _Texts(
        unit=[r[0] for r in rows], category=[r[1] for r in rows], grams=[ngrams(r[2] or "") for r in rows],
        y=np.array([float(r[3] or 0) for r in rows]),
        score=np.array([float(r[4]) if r[4] is not None else np.nan for r in rows]),
    )  # fmt: skip


_HASHED = text(
    """
    WITH r AS (
        SELECT request_id, unit_id, coalesce(category, 'other') AS category, grams
        FROM response_ngrams
        WHERE experiment_id = :e AND variant = :v AND role = 'primary' AND key_id = :k
        ORDER BY ts DESC LIMIT :n
    )
    SELECT r.unit_id, r.category, r.grams,
           (SELECT coalesce(max((kind = 'thumbs_up')::int), 0) - coalesce(max((kind = 'thumbs_down')::int), 0)
              FROM feedback f WHERE f.request_id = r.request_id AND f.experiment_id = :e
               AND kind IN ('thumbs_up', 'thumbs_down')),
           (SELECT avg(score) FROM judgements j WHERE j.request_id = r.request_id AND j.experiment_id = :e
               AND j.role = 'primary' AND j.status = 'ok')
    FROM r
    """
)


def _load_hashed(conn: Connection, eid: int, variant: str, key_id: str | None, opts: RiskOptions) -> _Texts:
    """The gateway's n-gram hashes of the most recent sampled responses (content logging
    ``hashed``), made with ``key_id``'s key."""
    rows = conn.execute(_HASHED, {"e": eid, "v": variant, "k": key_id, "n": opts.max_phrase_responses}).all()
    return _Texts(
        unit=[r[0] for r in rows], category=[r[1] for r in rows], grams=[set(r[2]) for r in rows],
        y=np.array([float(r[3] or 0) for r in rows]),
        score=np.array([float(r[4]) if r[4] is not None else np.nan for r in rows]),
    )  # fmt: skip


def _hashed_input(
    conn: Connection, eid: int, control: str, candidate: str, opts: RiskOptions
) -> tuple[_Texts, _Texts] | None:
    """Both arms' hashed n-grams when the experiment logs content ``hashed`` (None otherwise:
    its ``response`` column then holds text, never a digest)."""
    mode = conn.execute(text("SELECT content_logging FROM experiments WHERE id = :e"), {"e": eid}).scalar()
    if mode != "hashed":
        return None
    key_id = (
        opts.ngram_key_id
        or conn.execute(
            text("SELECT key_id FROM response_ngrams WHERE experiment_id = :e ORDER BY ts DESC LIMIT 1"),
            {"e": eid},
        ).scalar()
    )
    return _load_hashed(conn, eid, control, key_id, opts), _load_hashed(conn, eid, candidate, key_id, opts)


def _phrase_arm(t: _Texts, vocab: Mapping[Hashable, int]) -> tuple[PhraseArm, sparse.csr_matrix]:
    rows, cols = [], []
    for i, response_grams in enumerate(t.grams):
        for w in response_grams:
            j = vocab.get(w)
            if j is not None:
                rows.append(i)
                cols.append(j)
    x_resp = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(t.grams), len(vocab)))
    _, unit = np.unique(np.array(t.unit, dtype=object), return_inverse=True)
    unit = unit.reshape(-1)
    n_units = int(unit.max()) + 1 if len(unit) else 0
    u = sparse.csr_matrix((np.ones(len(unit)), (unit, np.arange(len(unit)))), shape=(n_units, len(unit)))
    x_unit = (u @ x_resp).tocsc()
    m = np.asarray(u.sum(axis=1)).reshape(-1)
    arm = PhraseArm(
        units=n_units, sum_m=float(m.sum()), sum_m2=float(m @ m),
        x=np.asarray(x_unit.sum(axis=0)).reshape(-1), x2=np.asarray(x_unit.multiply(x_unit).sum(axis=0)).reshape(-1),
        xm=np.asarray(x_unit.T @ m).reshape(-1),
    )  # fmt: skip
    return arm, x_resp


def _mean(values: np.ndarray) -> float | None:
    v = values[np.isfinite(values)]
    return float(v.mean()) if len(v) else None


def _phrases(conn: Connection, eid: int, control: str, candidate: str, opts: RiskOptions) -> PhrasePart:
    hashed = _hashed_input(conn, eid, control, candidate, opts)
    if hashed is None:
        tc, tt = _load_texts(conn, eid, control, opts), _load_texts(conn, eid, candidate, opts)
    else:
        tc, tt = hashed
    part = phrase_part(tc, tt, hashed is not None, opts)
    if hashed is not None and part.state == "unavailable" and opts.ngram_key_id is not None:
        other = conn.execute(
            text("SELECT key_id FROM response_ngrams WHERE experiment_id = :e AND key_id <> :k LIMIT 1"),
            {"e": eid, "k": opts.ngram_key_id},
        ).scalar()
        if other is not None:  # a key mismatch is not "nothing stored": say which
            why = (f"the n-gram hashes were made with another key (key id {other}, the analytics service's is "
                   f"{opts.ngram_key_id}): LIFTGATE_NGRAM_KEY must be the gateway's")  # fmt: skip
            part = part.model_copy(update={"reason": why})
    return part


def phrase_part(tc: _Texts, tt: _Texts, hashed: bool, opts: RiskOptions) -> PhrasePart:
    """The phrase table of two arms' responses (their gram texts, or their keyed hashes)."""
    base: dict[str, Any] = {"responses_control": len(tc.grams), "responses_candidate": len(tt.grams),
                            "source": "hashed" if hashed else "text"}  # fmt: skip
    if not tc.grams and not tt.grams:
        nothing = (
            "no hashed n-grams stored: set LIFTGATE_NGRAM_KEY (and a sample rate) on the gateway" if hashed
            else "no response texts stored: content logging is off"
        )  # fmt: skip
        return PhrasePart(state="unavailable", reason=nothing, **base)
    units = (len(set(tc.unit)), len(set(tt.unit)))
    if (why := _too_few(*units, opts.min_units, "units with stored responses")) is not None:
        return PhrasePart(state="insufficient_data", reason=why, **base)
    df: Counter[Hashable] = Counter()
    for response_grams in (*tc.grams, *tt.grams):
        df.update(response_grams)
    kept: list[Any] = sorted(w for w, c in df.items() if c >= opts.min_phrase_responses)
    vocab = {w: i for i, w in enumerate(kept)}
    labels = [hash_label(w) for w in kept] if hashed else kept
    column = {label: i for i, label in enumerate(labels)}
    arm_c, _ = _phrase_arm(tc, vocab)
    arm_t, x_t = _phrase_arm(tt, vocab)
    res = stuffed_phrases(labels, arm_c, arm_t, opts.alpha, opts.planned_units,
                          min_responses=opts.min_phrase_responses, top=opts.phrase_top)  # fmt: skip
    x_t = x_t.tocsc()
    rows = []
    for p in res.phrases:
        has = np.zeros(len(tt.grams), dtype=bool)
        j = column[p.phrase]
        col = x_t[:, j]
        has[col.nonzero()[0]] = True
        cats = Counter(c for c, h in zip(tt.category, has, strict=True) if h)
        rows.append(
            PhraseRow(
                **_phrase_text(kept[j], hashed, opts.phrase_lookup), rate_control=p.rate_control, rate_candidate=p.rate_candidate, log_odds=p.log_odds,
                z=p.z, p_value=p.p_value, q_value=p.q_value, flagged=p.flagged,
                categories=[c for c, _ in cats.most_common(5)], responses_with=int(has.sum()),
                outcome_with=_mean(tt.y[has]), outcome_without=_mean(tt.y[~has]),
                judge_with=_mean(tt.score[has]), judge_without=_mean(tt.score[~has]),
            )
        )  # fmt: skip
    return PhrasePart(
        state=_state_of(res.error), reason=res.message, tested=res.tested, phrases=rows,
        flagged=[r.phrase for r in rows if r.flagged], **base,
    )  # fmt: skip


def _phrase_text(gram: Any, hashed: bool, lookup: Mapping[int, str]) -> dict[str, Any]:
    if not hashed:
        return {"phrase": gram}
    known = lookup.get(gram)
    return {"phrase": known if known is not None else hash_label(gram), "hash": hash_label(gram),
            "resolved": known is not None}  # fmt: skip


def resolve_phrases(part: PhrasePart, lookup: Mapping[int, str]) -> PhrasePart:
    """``part`` with the text of the hashed phrases ``lookup`` (hash → text) resolves."""
    if part.source != "hashed" or not lookup:
        return part
    rows = []
    for row in part.phrases:
        if row.hash is not None and not row.resolved:
            known = lookup.get(int.from_bytes(bytes.fromhex(row.hash), "big", signed=True))
            if known is not None:
                row = row.model_copy(update={"phrase": known, "resolved": True})
        rows.append(row)
    return part.model_copy(update={"phrases": rows, "flagged": [r.phrase for r in rows if r.flagged]})


def _alarms(mix: CategoryMixPart, cap: CapabilityPart, verb: VerbosityPart, judge: JudgePart,
            phrases: PhrasePart) -> list[RiskAlarm]:  # fmt: skip
    harmed_cats = sorted({h.split("/", 1)[1] for h in cap.harmed})
    breached_cats = sorted({h.split("/", 1)[1] for h in cap.breached})
    guard_state: RiskState = cap.state
    if any(r.state != "ok" for r in cap.guardrails) and cap.state == "ok":
        guard_state = "insufficient_data"
    shifted = [s.category for s in mix.shares if s.difference is not None and mix.flagged]
    verb_detail = None
    if verb.alarm and verb.decomposition is not None:
        why = "users are not better off" if verb.no_gain else "the gain is all length"
        verb_detail = (
            f"responses {verb.relative_shift or 0.0:+.0%} longer; {why} "
            f"(residual {(verb.decomposition.residual.estimate if verb.decomposition.residual else 0.0):+.3g})"
        )
    return [
        RiskAlarm(name="forgetting", firing=bool(cap.harmed), state=cap.state, categories=harmed_cats,
                  detail=f"worse in {', '.join(cap.harmed)}" if cap.harmed else None),
        RiskAlarm(name="category_guardrail", firing=bool(cap.breached), state=guard_state,
                  categories=breached_cats,
                  detail=f"over the margin in {', '.join(cap.breached)}" if cap.breached else None),
        RiskAlarm(name="category_mix", firing=mix.flagged, state=mix.state, categories=shifted,
                  detail=f"category mix differs (p={mix.p_value:.2g})" if mix.flagged and mix.p_value is not None
                  else None),
        RiskAlarm(name="verbosity", firing=verb.alarm, state=verb.state, detail=verb_detail),
        RiskAlarm(name="goodhart", firing=judge.alarm, state=judge.state,
                  detail=(judge.summary if judge.diverged else "judge-to-user correlation dropped")
                  if judge.alarm else None),
        RiskAlarm(name="stuffing", firing=bool(phrases.flagged), state=phrases.state,
                  categories=sorted({c for p in phrases.phrases if p.flagged for c in p.categories}),
                  detail=f"over-represented: {', '.join(repr(p) for p in phrases.flagged[:5])}"
                  if phrases.flagged else None),
    ]  # fmt: skip


def rl_risks(
    conn: Connection,
    experiment_id: int,
    control: str,
    candidates: Sequence[str],
    opts: RiskOptions | None = None,
    *,
    rows: bool = False,
) -> list[RlRisks]:
    """The RL-risks section of each candidate against ``control`` (module docstring).

    ``rows``: read the per-row definition of the rollup (``analytics.ingest.rollups.RL_ROWS``)
    instead of ``rl_rollups``: the same section from the raw rows, one pass over every
    response (checks only)."""
    opts = opts or RiskOptions()
    if not candidates:
        return []
    src = _ROWS if rows else _ROLLUPS
    variants = [control, *candidates]
    tot = _load_totals(conn, experiment_id, variants, src)
    units = sum(a.units for a in tot.arms.values())
    share = min(1.0, opts.max_units / units) if units else 1.0
    ppm = round(share * 1_000_000)
    cell_rows = conn.execute(
        text(_CELLS.format(src=src)), {"e": experiment_id, "variants": variants, "ppm": ppm}
    ).all()
    judge_share = _judged_share(conn, experiment_id, share, opts)
    judged_rows = conn.execute(
        _JUDGED, {"e": experiment_id, "variants": variants, "ppm": round(judge_share * 1_000_000)}
    ).all()

    def sbin(x: np.ndarray) -> np.ndarray:
        return score_bin(x, opts.score_min, opts.score_max, SCORE_BINS)

    out = []
    for candidate in candidates:
        started = time.perf_counter()
        arms = (tot.arm(control), tot.arm(candidate))
        cells = _sample(cell_rows, control, candidate, lambda b: b.astype(np.int64))
        judged = _sample([(v, u, c, x, 1.0, y) for v, u, c, x, y in judged_rows], control, candidate, sbin)
        mix = _mix(tot, arms, opts)
        cap = _capability(tot, arms, opts)
        verb = _verbosity(arms, cells, opts)
        judge = _judge(conn, experiment_id, judged, judge_share, opts)
        phrases = _phrases(conn, experiment_id, control, candidate, opts)
        out.append(
            RlRisks(
                variant=candidate, control=control, outcome=OUTCOME, units_control=arms[0].units,
                units_candidate=arms[1].units, min_units=opts.min_units, units_share=share,
                alarms=_alarms(mix, cap, verb, judge, phrases), category_mix=mix, capability=cap,
                verbosity=verb, judge=judge, phrases=phrases, build_seconds=time.perf_counter() - started,
            )
        )  # fmt: skip
    return out


__all__ = ["MATRIX_METRICS", "OUTCOME", "RiskOptions", "ngrams", "resolve_phrases", "rl_risks"]
