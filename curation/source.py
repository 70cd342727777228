"""Reading production interactions for curation: the filters as SQL, streamed in order.

Only primary calls (the answers users saw) become items. A call's category is its
``category`` column when the schema has one, else its ``category`` tag, else ``other``.
A call's feedback is the feedback attributed to it (same experiment, by request id).

``judge_disagrees`` selects calls whose ``judge_score`` feedback (1-10) contradicts the
user: the judge gave ≥ 7 and the user sent ``thumbs_down`` or ``regenerate``, or the judge
gave ≤ 4 and the user sent ``thumbs_up``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, inspect, text

from curation.db import stream
from curation.spec import FILTER_KINDS, CurationError, CurationSpec, NotFound

#: A stored prompt that is a SHA-256 was logged while content logging was ``hashed``.
_HEX64 = re.compile(r"[0-9a-f]{64}")
JUDGE_HIGH, JUDGE_LOW = 7.0, 4.0
#: A judged shadow pair has a side the judge prefers when the two scores of the same judge
#: differ by at least this much (points on the judge's scale, 1-10 by default): a one-point
#: gap on a 10-point rubric is the smallest difference a judge states on purpose.
JUDGE_MARGIN = 1.0
#: What the user did to the answer they saw that says they liked it (or not).
POSITIVE_KINDS = frozenset({"thumbs_up", "copy"})
DISLIKED_KINDS = frozenset({"thumbs_down", "regenerate", "edit"})


@dataclass(frozen=True, slots=True)
class Experiment:
    id: int
    name: str
    content_logging: str


@dataclass(frozen=True, slots=True)
class Row:
    request_id: str
    ts: datetime
    variant: str | None
    unit_id: str
    conversation_id: str | None
    status: str
    category: str
    prompt: str | None
    response: str | None
    kinds: tuple[str, ...]
    rating: float | None
    judge_score: float | None

    @property
    def has_text(self) -> bool:
        return self.prompt is not None and not (
            _HEX64.fullmatch(self.prompt) and (self.response is None or _HEX64.fullmatch(self.response))
        )


def experiment(conn: Connection, ref: str) -> Experiment:
    cond = "name = :ref" + (" OR id = CAST(:ref AS integer)" if ref.isdigit() else "")
    row = conn.execute(
        text(f"SELECT id, name, content_logging FROM experiments WHERE {cond}"), {"ref": ref}
    ).first()
    if row is None:
        raise NotFound(f"no experiment {ref!r}")
    return Experiment(int(row[0]), str(row[1]), str(row[2]))


def require_full_content(exp: Experiment) -> None:
    if exp.content_logging != "full":
        raise CurationError(
            f"experiment {exp.name!r} logs content as {exp.content_logging!r}: datasets need the "
            "prompt and response text, which is stored only with content_logging 'full' "
            f"(set it with the admin API: PATCH /admin/experiments/{exp.name} "
            '{"content_logging": "full"}); calls logged before that cannot become items'
        )


def category_sql(conn: Connection) -> str:
    """SQL for a call's category (alias ``i``)."""
    columns = {c["name"] for c in inspect(conn).get_columns("interactions")}
    tag = "NULLIF(i.tags->>'category', '')"
    return (
        f"COALESCE(NULLIF(i.category, ''), {tag}, 'other')"
        if "category" in columns
        else f"COALESCE({tag}, 'other')"
    )


def _where(spec: CurationSpec, category: str) -> tuple[str, dict[str, Any]]:
    clauses = ["i.experiment_id = :e", "i.role = 'primary'"]
    params: dict[str, Any] = {}
    if spec.variant is not None:
        clauses.append("i.variant = :variant")
        params["variant"] = spec.variant
    if spec.since is not None:
        clauses.append("i.ts >= :since")
        params["since"] = spec.since
    if spec.until is not None:
        clauses.append("i.ts < :until")
        params["until"] = spec.until
    if spec.category is not None:
        clauses.append(f"{category} = :category")
        params["category"] = spec.category
    ors = []
    kinds = [FILTER_KINDS[f] for f in spec.feedback if f in FILTER_KINDS]
    if kinds:
        ors.append("fb.kinds && CAST(:kinds AS text[])")
        params["kinds"] = kinds
    if "error" in spec.feedback:
        ors.append("i.status = 'error'")
    if "judge_disagrees" in spec.feedback:
        ors.append(
            f"(fb.judge >= {JUDGE_HIGH} AND fb.kinds && ARRAY['thumbs_down', 'regenerate']::text[])"
            f" OR (fb.judge <= {JUDGE_LOW} AND 'thumbs_up' = ANY(fb.kinds))"
        )
    if ors:
        clauses.append("(" + " OR ".join(ors) + ")")
    return " AND ".join(clauses), params


_FEEDBACK = (
    "LEFT JOIN (SELECT request_id, array_agg(DISTINCT kind::text) AS kinds,"
    " max(value) FILTER (WHERE kind = 'rating') AS rating,"
    " max(value) FILTER (WHERE kind = 'judge_score') AS judge"
    " FROM feedback WHERE experiment_id = :e GROUP BY request_id) fb ON fb.request_id = i.request_id"
)


def counts(conn: Connection, exp: Experiment, spec: CurationSpec) -> dict[str, int]:
    """Matching calls per category (before de-duplication)."""
    category = category_sql(conn)
    where, params = _where(spec, category)
    rows = conn.execute(
        text(f"SELECT {category}, count(*) FROM interactions i {_FEEDBACK} WHERE {where} GROUP BY 1"),
        {"e": exp.id, **params},
    ).all()
    return {str(r[0]): int(r[1]) for r in rows}


#: Memory for the by-time sort of the matching calls (per sort node, one transaction).
SORT_MEMORY = "128MB"


def rows(
    conn: Connection, exp: Experiment, spec: CurationSpec, *, category: str | None = None, batch: int = 2000,
    limit: int | None = None, offset: int = 0,
) -> Generator[list[Row], None, None]:  # fmt: skip
    """Matching calls in batches: in a seeded random order within ``category`` when
    sampling, else by time. Streamed with a server-side cursor (bounded memory). ``limit``
    and ``offset`` page through that order (a total order: ties broken by request id), so
    PostgreSQL keeps only the page's rows in a top-N sort instead of sorting them all."""
    cat_sql = category_sql(conn)
    where, params = _where(spec, cat_sql)
    if category is not None:
        where += f" AND {cat_sql} = :only_category"
        params["only_category"] = category
    order = "md5(CAST(:seed AS text) || i.request_id), i.request_id" if spec.sample else "i.ts, i.request_id"
    if not spec.sample:
        # Every matching call is sorted by time with its text (~60 MB for 100,000 calls):
        # in memory rather than in temporary files (this transaction only).
        conn.execute(text(f"SET LOCAL work_mem = '{SORT_MEMORY}'"))
    query = text(
        f"SELECT i.request_id, i.ts, i.variant, i.unit_id, i.conversation_id, i.status, {cat_sql}, i.prompt,"
        f" i.response, COALESCE(fb.kinds, ARRAY[]::text[]), fb.rating, fb.judge"
        f" FROM interactions i {_FEEDBACK} WHERE {where} ORDER BY {order}"
        + (" LIMIT :limit OFFSET :offset" if limit is not None else "")
    )
    params.update(limit=limit, offset=offset)
    result = stream(conn, batch, query, {"e": exp.id, "seed": str(spec.seed), **params})
    try:
        for part in result.partitions(batch):
            yield [
                Row(
                    str(r[0]),
                    r[1],
                    r[2],
                    str(r[3]),
                    r[4],
                    str(r[5]),
                    str(r[6]),
                    r[7],
                    r[8],
                    tuple(sorted(r[9])),
                    r[10],
                    r[11],
                )
                for r in part
            ]
    finally:
        result.close()


def references(conn: Connection, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The newest user-supplied reference of each kind, per request id."""
    if not request_ids:
        return {}
    found = conn.execute(
        text(
            'SELECT DISTINCT ON (request_id, kind) request_id, kind, text, "check", value FROM feedback_references'
            " WHERE request_id = ANY(:ids) ORDER BY request_id, kind, id DESC"
        ),
        {"ids": request_ids},
    ).all()
    out: dict[str, dict[str, Any]] = {}
    for rid, kind, body, check, value in found:
        ref = out.setdefault(str(rid), {})
        if kind == "edit" and body is not None:
            ref["text"] = body
        elif kind == "task_success" and check is not None:
            ref["check"] = check
        elif kind == "rating" and value is not None:
            ref["rating"] = float(value)
    return out


def regenerations(conn: Connection, exp: Experiment, regenerated: list[Row]) -> dict[str, Row]:
    """For each regenerated call, the answer the user kept: the next primary call of the same
    unit with the same prompt that got no thumbs-down, regenerate or edit."""
    if not regenerated:
        return {}
    units = sorted({r.unit_id for r in regenerated})
    found = conn.execute(
        text(
            "SELECT i.request_id, i.ts, i.unit_id, i.prompt, i.response FROM interactions i"
            " WHERE i.experiment_id = :e AND i.role = 'primary' AND i.status = 'ok' AND i.unit_id = ANY(:units)"
            " AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.request_id = i.request_id"
            "   AND f.kind IN ('thumbs_down', 'regenerate', 'edit'))"
            " ORDER BY i.ts"
        ),
        {"e": exp.id, "units": units},
    ).all()
    later: dict[tuple[str, str], list[tuple[datetime, str, str | None]]] = {}
    for rid, ts, unit, prompt, response in found:
        if prompt is not None:
            later.setdefault((str(unit), str(prompt)), []).append((ts, str(rid), response))
    out: dict[str, Row] = {}
    for row in regenerated:
        for ts, rid, response in later.get((row.unit_id, row.prompt or ""), ()):
            if ts > row.ts and response:
                out[row.request_id] = Row(rid, ts, row.variant, row.unit_id, row.conversation_id, "ok",
                                          row.category, row.prompt, response, (), None, None)  # fmt: skip
                break
    return out


@dataclass(frozen=True, slots=True)
class ShadowSide:
    """A judged shadow call paired with a primary call: its answer and both sides' scores."""

    request_id: str
    variant: str | None
    response: str
    judge: str
    primary_score: float
    shadow_score: float


def judged_preference(primary_score: float, shadow_score: float, kinds: tuple[str, ...] | frozenset[str],
                      margin: float = JUDGE_MARGIN) -> str | None:  # fmt: skip
    """Which side of a judged shadow pair is preferred: ``"primary"``, ``"shadow"`` or None.

    The judge decides (scores at least ``margin`` apart, else a tie: None); the user's own
    signal on the answer they saw vetoes a judge that contradicts it — a thumbs-up or copy
    of the primary answer when the judge prefers the shadow, a thumbs-down, regenerate or
    edit of it when the judge prefers the primary — so a pair is never learned against
    what the user said. NaN or infinite scores are no preference.
    """
    if not (math.isfinite(primary_score) and math.isfinite(shadow_score)):
        return None
    gap = shadow_score - primary_score
    if abs(gap) < margin:
        return None
    said = set(kinds)
    liked, disliked = bool(said & POSITIVE_KINDS), bool(said & DISLIKED_KINDS)
    if gap > 0:
        return None if liked and not disliked else "shadow"
    return None if disliked else "primary"


def shadow_pairs(conn: Connection, exp: Experiment, primary: list[str]) -> dict[str, list[ShadowSide]]:
    """The judged shadow calls of these primary calls (by ``pair_id``), where one judge scored
    both sides (status ok, a score) and the shadow's text is stored."""
    if not primary:
        return {}
    found = conn.execute(
        text(
            "SELECT s.pair_id, s.request_id, s.variant, s.response, js.judge, jp.score, js.score"
            " FROM interactions s"
            " JOIN judgements js ON js.request_id = s.request_id AND js.status = 'ok' AND js.score IS NOT NULL"
            " JOIN judgements jp ON jp.request_id = s.pair_id AND jp.judge = js.judge AND jp.role = 'primary'"
            "   AND jp.status = 'ok' AND jp.score IS NOT NULL"
            " WHERE s.pair_id = ANY(:ids) AND s.role = 'shadow' AND s.experiment_id = :e AND s.status = 'ok'"
            "   AND s.response IS NOT NULL AND s.response <> ''"
            " ORDER BY s.pair_id, s.request_id, js.judge"
        ),
        {"ids": primary, "e": exp.id},
    ).all()
    out: dict[str, list[ShadowSide]] = {}
    for pair_id, rid, variant, response, judge, p_score, s_score in found:
        if _HEX64.fullmatch(str(response)):
            continue  # logged as a hash
        out.setdefault(str(pair_id), []).append(
            ShadowSide(str(rid), variant, str(response), str(judge), float(p_score), float(s_score))
        )
    return out
