"""The report's RL-risks section: stored interactions, feedback and judgements → the pure
detectors of :mod:`analytics.risks` → :class:`~analytics.report.risks_schema.RlRisks`.

One aggregate query per experiment reads every primary response of the control and the
candidates once and groups it to one row per (unit, variant, category, length bin, judge
score bin) with the sums every detector needs; the cost of the statistics grows with those
rows, not with responses. Phrases read the most recent ``max_phrase_responses`` stored
response texts per arm (content logging ``full``/``redacted``); a bounded sample, never the
whole table.

The user outcome of a response (``satisfaction``) is its thumbs-up minus its thumbs-down
(each counted once per response): +1, 0 (no vote) or −1. The capability matrix tests the
thumbs-up rate, the thumbs-down rate and satisfaction per category (ratio metrics per
unit: a unit's sum over its responses of that category / its responses of that category).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse
from sqlalchemy import Connection, text

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
from analytics.risks.curve import LENGTH_BINS_PER_DOUBLING
from analytics.stats import DEFAULT_PLANNED_UNITS, Direction, ErrorCode, MetricKind, SampleStats

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
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)?")
_MAX_TEXT = 4000  # characters of a response tokenised for phrases


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


_GROUPS = text(
    """
    WITH r AS (
        SELECT i.request_id, i.unit_id, i.variant, coalesce(i.category, 'other') AS category,
               greatest(coalesce(i.completion_tokens, 0), 0) AS tokens
        FROM interactions i
        WHERE i.experiment_id = :e AND i.role = 'primary' AND i.status = 'ok'
          AND i.variant = ANY(:variants)
          AND (:ppm >= 1000000 OR (hashtext(i.unit_id) & 2147483647) % 1000000 < :ppm)
    ), f AS (
        SELECT request_id, max((kind = 'thumbs_up')::int) AS up, max((kind = 'thumbs_down')::int) AS down
        FROM feedback
        WHERE experiment_id = :e AND kind IN ('thumbs_up', 'thumbs_down')
        GROUP BY request_id
    ), j AS (
        SELECT request_id, avg(score) AS score
        FROM judgements
        WHERE experiment_id = :e AND role = 'primary' AND status = 'ok' AND score IS NOT NULL
        GROUP BY request_id
    ), x AS (
        SELECT r.unit_id, r.variant, r.category, r.tokens, j.score,
               coalesce(f.up, 0) AS up, coalesce(f.down, 0) AS down,
               coalesce(f.up, 0) - coalesce(f.down, 0) AS y
        FROM r LEFT JOIN f USING (request_id) LEFT JOIN j USING (request_id)
    )
    SELECT unit_id, variant, category,
           floor(:lb * ln(1 + tokens::float8) / ln(2.0::float8))::int AS lbin,
           CASE WHEN score IS NULL THEN -1
                ELSE least(:sb - 1, greatest(0, floor((score - :lo) / :sw)))::int END AS sbin,
           count(*), sum(tokens), sum(up), sum(down), sum(y),
           count(score), coalesce(sum(score), 0), coalesce(sum(score * score), 0),
           coalesce(sum(score * y) FILTER (WHERE score IS NOT NULL), 0),
           coalesce(sum(y) FILTER (WHERE score IS NOT NULL), 0),
           coalesce(sum(y * y) FILTER (WHERE score IS NOT NULL), 0)
    FROM x
    GROUP BY 1, 2, 3, 4, 5
    """
)
_COLUMNS = ("n", "tokens", "up", "down", "y", "nj", "s", "ss", "sy", "yj", "yyj")

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


@dataclass(frozen=True, slots=True, eq=False)
class _Groups:
    """The aggregate rows as arrays: unit (dense over all arms), arm name, category code."""

    unit: np.ndarray
    variant: np.ndarray  # object array of variant names
    category: np.ndarray
    categories: tuple[str, ...]
    lbin: np.ndarray
    sbin: np.ndarray
    v: dict[str, np.ndarray]


def _units_share(conn: Connection, eid: int, opts: RiskOptions) -> float:
    """The share of units the detectors read (1.0 up to ``max_units`` units)."""
    units = conn.execute(
        text("SELECT count(*) FROM unit_rollups WHERE experiment_id = :e"), {"e": eid}
    ).scalar()
    if not units:  # no rollups (tests, raw rows only): count the raw rows' units
        units = conn.execute(
            text("SELECT count(DISTINCT unit_id) FROM interactions WHERE experiment_id = :e"), {"e": eid}
        ).scalar()
    return min(1.0, opts.max_units / units) if units else 1.0


def _load_groups(
    conn: Connection, eid: int, variants: Sequence[str], opts: RiskOptions, share: float = 1.0
) -> _Groups:
    width = (opts.score_max - opts.score_min) / SCORE_BINS
    rows = conn.execute(
        _GROUPS,
        {"ppm": round(share * 1_000_000), "e": eid, "variants": list(variants), "lb": LENGTH_BINS_PER_DOUBLING,
         "sb": SCORE_BINS, "lo": opts.score_min, "sw": width},
    ).all()  # fmt: skip
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return _Groups(empty, np.zeros(0, dtype=object), empty, (), empty, empty,
                       {name: np.zeros(0) for name in _COLUMNS})  # fmt: skip
    table = np.array(rows, dtype=object)  # column-wise conversion: no per-value Python loop
    _, unit_codes = np.unique(table[:, 0].astype(str), return_inverse=True)
    categories_all, cat_codes = np.unique(table[:, 2].astype(str), return_inverse=True)
    cols = table[:, 5:].astype(float)
    return _Groups(
        unit=unit_codes.astype(np.int64).reshape(-1),
        variant=table[:, 1].astype(str).astype(object),
        category=cat_codes.astype(np.int64).reshape(-1),
        categories=tuple(str(c) for c in categories_all),
        lbin=table[:, 3].astype(np.int64),
        sbin=table[:, 4].astype(np.int64),
        v={name: cols[:, i] for i, name in enumerate(_COLUMNS)},
    )


def _unit_sums(g: _Groups, mask: np.ndarray, keys: np.ndarray, columns: Sequence[str]) -> list[np.ndarray]:
    """Per distinct ``keys`` value among ``mask`` rows, the sums of ``columns`` (same order)."""
    _, inv = np.unique(keys[mask], return_inverse=True)
    inv = inv.reshape(-1)
    return [np.bincount(inv, weights=g.v[c][mask]) for c in columns]


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


def _mix(g: _Groups, arms: tuple[np.ndarray, np.ndarray], opts: RiskOptions) -> CategoryMixPart:
    k = len(g.categories)
    stats = []
    n_units = []
    for mask in arms:
        _, unit = np.unique(g.unit[mask], return_inverse=True)
        unit = unit.reshape(-1)
        m = np.zeros((int(unit.max()) + 1 if len(unit) else 0, k))
        np.add.at(m, (unit, g.category[mask]), g.v["n"][mask])
        stats.append(MixStats.from_counts(m))
        n_units.append(m.shape[0])
    if (why := _too_few(n_units[0], n_units[1], opts.min_units)) is not None:
        return CategoryMixPart(state="insufficient_data", reason=why)
    res = category_mix(g.categories, stats[0], stats[1])
    shares = [
        CategoryShareRow(category=s.category, control=s.control, candidate=s.candidate,
                         difference=s.difference, std_error=s.std_error)
        for s in res.shares
    ]  # fmt: skip
    return CategoryMixPart(
        state=_state_of(res.error), reason=res.message, flagged=res.flagged, p_value=res.p_value,
        chi2=res.chi2, dof=res.dof, threshold=res.threshold, shares=shares,
    )  # fmt: skip


def _capability(g: _Groups, arms: tuple[np.ndarray, np.ndarray], opts: RiskOptions) -> CapabilityPart:
    metrics = list(MATRIX_METRICS)
    inputs: list[MatrixInput] = []
    skipped: list[MatrixCellRow] = []
    for code, category in enumerate(g.categories):
        per_arm = []
        for mask in arms:
            m = mask & (g.category == code)
            sums = _unit_sums(g, m, g.unit, ["n", "up", "down", "y"]) if m.any() else [np.zeros(0)] * 4
            per_arm.append(dict(zip(["n", "up", "down", "y"], sums, strict=True)))
        for metric in metrics:
            direction, col = MATRIX_METRICS[metric]
            sc, st = (_ratio_stats(a[col], a["n"]) for a in per_arm)
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
        state=state, reason=reason, metrics=metrics, categories=list(g.categories), cells=cells,
        guardrails=sorted(guards, key=lambda r: (r.metric, r.category)),
        harmed=[f"{m}/{c}" for m, c in matrix.harmed_categories],
        breached=[f"{m}/{c}" for m, c in matrix.breached],
    )  # fmt: skip


def _curve(
    g: _Groups, arms: tuple[np.ndarray, np.ndarray], bins: np.ndarray, n: str, y: str, edges: Any
) -> list[CurvePoint]:
    """Mean outcome per bin and arm, pooled over categories (the chart's points)."""
    out = []
    for b in np.unique(bins[arms[0] | arms[1]]).tolist():
        if b < 0:
            continue
        vals = []
        for mask in arms:
            m = mask & (bins == b)
            nn, yy = float(g.v[n][m].sum()), float(g.v[y][m].sum())
            vals.append((int(nn), yy / nn if nn > 0 else None))
        low, high = edges(b)
        out.append(CurvePoint(bin=int(b), low=low, high=high, control_n=vals[0][0], control_outcome=vals[0][1],
                              candidate_n=vals[1][0], candidate_outcome=vals[1][1]))  # fmt: skip
    return out


def _length_edges(b: int) -> tuple[float, float]:
    return 2 ** (b / LENGTH_BINS_PER_DOUBLING) - 1, 2 ** ((b + 1) / LENGTH_BINS_PER_DOUBLING) - 1


def _cells(g: _Groups, arms: tuple[np.ndarray, np.ndarray], bins: np.ndarray, n: str, y: str) -> Cells:
    both = (arms[0] | arms[1]) & (g.v[n] > 0)
    _, unit = np.unique(g.unit[both], return_inverse=True)
    return _aggregate_cells(
        unit.reshape(-1),
        arms[1][both].astype(np.int64),
        g.category[both],
        bins[both],
        g.v[n][both],
        g.v[y][both],
    )


def _aggregate_cells(
    unit: np.ndarray, arm: np.ndarray, category: np.ndarray, bins: np.ndarray, n: np.ndarray, y: np.ndarray
) -> Cells:
    """Rows already aggregated by SQL, merged to one per (unit, arm, category, bin)."""
    keys = np.stack([unit, arm, category, bins], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    return Cells(
        uniq[:, 0], uniq[:, 1], uniq[:, 2], uniq[:, 3],
        np.bincount(inv, weights=n, minlength=len(uniq)), np.bincount(inv, weights=y, minlength=len(uniq)),
    )  # fmt: skip


def _verbosity(
    g: _Groups, arms: tuple[np.ndarray, np.ndarray], n_units: tuple[int, int], opts: RiskOptions
) -> VerbosityPart:
    if (why := _too_few(*n_units, opts.min_units)) is not None:
        return VerbosityPart(state="insufficient_data", reason=why, outcome=OUTCOME)
    lengths = []
    for mask in arms:
        tokens, n = _unit_sums(g, mask, g.unit, ["tokens", "n"])
        lengths.append(_ratio_stats(tokens, n))
    cells = _cells(g, arms, g.lbin, "n", "y")
    res = verbosity(lengths[0], lengths[1], cells, opts.alpha, opts.planned_units,
                    replicates=opts.replicates, seed=opts.seed)  # fmt: skip
    sh, dec = res.length, res.decomposition
    error = sh.error or dec.error
    return VerbosityPart(
        state=_state_of(error), reason=sh.message or dec.message, outcome=OUTCOME, tokens_control=sh.control,
        tokens_candidate=sh.candidate, shift=_ev(sh.shift), relative_shift=sh.relative, longer=sh.longer,
        decomposition=_dec(dec), gain_is_length=res.gain_is_length, no_gain=res.no_gain, alarm=res.alarm,
        curve=_curve(g, arms, g.lbin, "n", "y", _length_edges),
    )  # fmt: skip


def _judges(conn: Connection, eid: int) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT DISTINCT judge FROM judgements WHERE experiment_id = :e AND status = 'ok' ORDER BY 1 LIMIT 20"
        ),
        {"e": eid},
    )
    return [r[0] for r in rows]


def _judge(
    conn: Connection, eid: int, g: _Groups, arms: tuple[np.ndarray, np.ndarray], opts: RiskOptions
) -> JudgePart:
    judged = [mask & (g.v["nj"] > 0) for mask in arms]
    counts = [int(g.v["nj"][m].sum()) for m in judged]
    base: dict[str, Any] = {"outcome": OUTCOME, "judged_control": counts[0], "judged_candidate": counts[1]}
    if counts[0] + counts[1] == 0:
        return JudgePart(
            state="unavailable", reason="no judge scores: configure the gateway's judge sampler", **base
        )
    base["judges"] = _judges(conn, eid)
    means = [float(g.v["s"][m].sum()) / c if c else None for m, c in zip(judged, counts, strict=True)]
    base |= {"mean_score_control": means[0], "mean_score_candidate": means[1]}
    units = [len(np.unique(g.unit[m])) for m in judged]
    if (why := _too_few(units[0], units[1], opts.min_units, "units with judged responses")) is not None:
        return JudgePart(state="insufficient_data", reason=why, **base)
    cells = _cells(g, (judged[0], judged[1]), g.sbin, "nj", "yj")
    pairs = []
    for m in judged:
        n, s, y, ss, yy, sy = _unit_sums(g, m, g.unit, ["nj", "s", "yj", "ss", "yyj", "sy"])
        pairs.append(PairMoments(n, s, y, ss, yy, sy))
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
        alarm=res.alarm, curve=_curve(g, (judged[0], judged[1]), g.sbin, "nj", "yj", edges), **base,
    )  # fmt: skip


def ngrams(text_: str) -> set[str]:
    """Word 1–3-grams of a response (lower-cased words of letters, digits and inner apostrophes)."""
    words = _WORD.findall(text_[:_MAX_TEXT].lower())
    out = set(words)
    out.update(" ".join(words[i : i + 2]) for i in range(len(words) - 1))
    out.update(" ".join(words[i : i + 3]) for i in range(len(words) - 2))
    return out


@dataclass(frozen=True, slots=True)
class _Texts:
    unit: list[str]
    category: list[str]
    grams: list[set[str]]
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


def _phrase_arm(t: _Texts, vocab: dict[str, int]) -> tuple[PhraseArm, sparse.csr_matrix]:
    rows, cols = [], []
    for i, grams in enumerate(t.grams):
        for w in grams:
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
    tc, tt = _load_texts(conn, eid, control, opts), _load_texts(conn, eid, candidate, opts)
    base: dict[str, Any] = {"responses_control": len(tc.grams), "responses_candidate": len(tt.grams)}
    if not tc.grams and not tt.grams:
        return PhrasePart(
            state="unavailable", reason="no response texts stored: content logging is off", **base
        )
    units = (len(set(tc.unit)), len(set(tt.unit)))
    if (why := _too_few(*units, opts.min_units, "units with stored responses")) is not None:
        return PhrasePart(state="insufficient_data", reason=why, **base)
    df: Counter[str] = Counter()
    for grams in (*tc.grams, *tt.grams):
        df.update(grams)
    kept = sorted(w for w, c in df.items() if c >= opts.min_phrase_responses)
    vocab = {w: i for i, w in enumerate(kept)}
    arm_c, _ = _phrase_arm(tc, vocab)
    arm_t, x_t = _phrase_arm(tt, vocab)
    res = stuffed_phrases(kept, arm_c, arm_t, opts.alpha, opts.planned_units,
                          min_responses=opts.min_phrase_responses, top=opts.phrase_top)  # fmt: skip
    x_t = x_t.tocsc()
    rows = []
    for p in res.phrases:
        has = np.zeros(len(tt.grams), dtype=bool)
        col = x_t[:, vocab[p.phrase]]
        has[col.nonzero()[0]] = True
        cats = Counter(c for c, h in zip(tt.category, has, strict=True) if h)
        rows.append(
            PhraseRow(
                phrase=p.phrase, rate_control=p.rate_control, rate_candidate=p.rate_candidate, log_odds=p.log_odds,
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
) -> list[RlRisks]:
    """The RL-risks section of each candidate against ``control`` (module docstring)."""
    opts = opts or RiskOptions()
    if not candidates:
        return []
    share = _units_share(conn, experiment_id, opts)
    g = _load_groups(conn, experiment_id, [control, *candidates], opts, share)
    out = []
    for candidate in candidates:
        started = time.perf_counter()
        arms = (g.variant == control, g.variant == candidate)
        n_units = (len(np.unique(g.unit[arms[0]])), len(np.unique(g.unit[arms[1]])))
        mix = _mix(g, arms, opts)
        cap = _capability(g, arms, opts)
        verb = _verbosity(g, arms, n_units, opts)
        judge = _judge(conn, experiment_id, g, arms, opts)
        phrases = _phrases(conn, experiment_id, control, candidate, opts)
        out.append(
            RlRisks(
                variant=candidate, control=control, outcome=OUTCOME, units_control=n_units[0],
                units_candidate=n_units[1], min_units=opts.min_units, units_share=share,
                alarms=_alarms(mix, cap, verb, judge, phrases), category_mix=mix, capability=cap,
                verbosity=verb, judge=judge, phrases=phrases, build_seconds=time.perf_counter() - started,
            )
        )  # fmt: skip
    return out


__all__ = ["MATRIX_METRICS", "OUTCOME", "RiskOptions", "ngrams", "rl_risks"]
