"""Examples side by side: sampled requests of an experiment, shadow pairs with both answers,
and the requests behind a metric.

**Sampling.** Requests are listed in the order of a 64-bit hash of their request id
(``hashtextextended(request_id, 0)``), ties broken by event id. That order is a fixed,
uniformly random permutation of the traffic: the first page is a uniform sample of the
requests that match the filters, the same on every load, and each variant is sampled the
same way (no variant's slow or failed calls come first). The index
``ix_interactions_examples`` (experiment, variant, hash, event id) serves both the order and
the keyset cursor, so a page costs a short index range scan whatever the table's size; with
no variant chosen, each variant's range is read and the pages merged.

**Pagination.** The cursor is the last item's (hash, event id): a later page never repeats
or skips a row that existed when the first page was read. Rows ingested meanwhile land at
random positions (those before the cursor are not shown on later pages).

**Content.** What the gateway stored depends on the experiment's ``content_logging``:
``full`` (text after the redaction rules), ``hashed`` (keyed 256-bit digests of the
redacted text, 64 hex characters) or ``none`` (nothing). Content is returned under the experiment's *current* setting,
failing closed: with ``none`` no stored text is returned even if some was logged earlier;
with ``hashed`` only values that are digests (64 hex characters) are returned. Text longer than
``TEXT_MAX`` characters is cut (the full length is given).
"""

from __future__ import annotations

import ast
import base64
import binascii
import math
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import orjson
from psycopg.errors import QueryCanceled
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from analytics.report.catalogue import BUILTINS, Metric, MetricError, parse_spec

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 100
#: Longest prompt or response text returned per item (the page collapses long answers).
TEXT_MAX: Final = 16_000
#: Feedback and judgement rows shown per item at most.
MAX_ATTACHED: Final = 20
#: The longest a page may take in the database. A filter matching almost none of a large
#: variant's requests walks the variant's whole index range before it knows the page is
#: short; past this budget the query is cancelled and the caller told to narrow it.
TIMEOUT_MS: Final = 5_000
TIMEOUT_REASON: Final = (
    f"sampling took longer than {TIMEOUT_MS / 1000:g} s: these filters match very few of the"
    " requests; narrow them with a variant and a time window (since/until)"
)
#: A segment is ``tag=value`` (as in the report's segment breakdowns).
_SEGMENT: Final = re.compile(r"([^=\s]{1,128})=(.{1,256})", re.S)
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_KEY: Final = "hashtextextended(i.request_id, 0)"

ContentLogging = Literal["none", "hashed", "full"]

NOTES: Final[dict[str, str]] = {
    "none": (
        "Content logging is off for this experiment (content_logging: none): no prompt or response"
        " text is stored. Set content_logging to full (or hashed) to see what the models answered;"
        " until then only each request's metadata is shown."
    ),
    "hashed": (
        "Content logging is hashed: only keyed digests of the redacted prompt and answer are stored."
        " Equal digests mean equal text; the text itself cannot be shown."
    ),
    "full": (
        "Text as the gateway stored it, after the redaction rules (e-mail addresses and runs of"
        " three or more digits replaced)."
    ),
}

#: Rollup measures fed by one feedback kind: a metric over one of these links to the
#: requests that received that kind of feedback.
_MEASURE_KINDS: Final[dict[str, str]] = {
    "thumbs_up": "thumbs_up",
    "thumbs_down": "thumbs_down",
    "ratings_sum": "rating",
    "ratings_n": "rating",
    "regenerates": "regenerate",
    "copies": "copy",
    "edits": "edit",
    "continued": "continued",
    "task_success_sum": "task_success",
    "task_success_n": "task_success",
}
_FAILURE_MEASURES: Final = frozenset({"errors", "fallbacks"})


class ExampleError(ValueError):
    """A request for examples that cannot be answered; the message says why (a 4xx)."""


class ExampleTimeout(Exception):
    """The page took longer than its budget (a 503 with the reason)."""


@dataclass(frozen=True, slots=True)
class ExampleFilter:
    """Which requests to list. Every field narrows; None means any."""

    variant: str | None = None
    segment: str | None = None  # "tag=value"
    category: str | None = None
    feedback: str | None = None  # a feedback kind the (primary) response received
    score_min: float | None = None  # a judgement of the response scored at least this ...
    score_max: float | None = None  # ... and at most this
    judge: str | None = None  # ... by this judge (alone: any score by this judge)
    error: bool | None = None  # True: failed (or rescued by the fallback); False: succeeded
    since: datetime | None = None
    until: datetime | None = None

    def check(self) -> None:
        for name in ("variant", "segment", "category", "feedback", "judge"):
            value = getattr(self, name)
            # PostgreSQL text holds no NUL, and no stored name has control characters.
            if value is not None and not value.isprintable():
                raise ExampleError(f"{name} must be printable text (no control characters)")
        for name in ("score_min", "score_max"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ExampleError(f"{name} must be a finite number")
        if self.score_min is not None and self.score_max is not None and self.score_min > self.score_max:
            raise ExampleError(f"score_min ({self.score_min:g}) is above score_max ({self.score_max:g})")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ExampleError("since must be before until")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ExampleError(f"{name} needs a time zone (e.g. 2026-12-01T08:00:00Z)")
        if self.segment is not None and _SEGMENT.fullmatch(self.segment) is None:
            raise ExampleError("segment must be 'tag=value' (as in the report's segments)")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.isoformat() if isinstance(value, datetime) else value
        return out


@dataclass(frozen=True, slots=True)
class MetricLink:
    """How a metric's value is made of requests: the filter that lists them, and why."""

    metric: str
    feedback: str | None = None
    error: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --- cursors ---------------------------------------------------------------------------------


def encode_cursor(key: int, event_id: str) -> str:
    return base64.urlsafe_b64encode(f"{key}:{event_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """(hash, event id) of a cursor from ``encode_cursor``; ExampleError for anything else."""
    bad = ExampleError("cursor is not one this API returned (pass next_cursor back unchanged)")
    if len(cursor) > 200 or not cursor.isascii():
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        key_text, _, event_id = raw.partition(":")
        key = int(key_text)
        event_id = str(uuid.UUID(event_id))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    if not -(2**63) <= key < 2**63:
        raise bad
    return key, event_id


# --- metrics -----------------------------------------------------------------------------------


def _expression_names(expr: str) -> tuple[set[str], set[str]]:
    """The measures and the custom-feedback counters an expression reads."""
    measures: set[str] = set()
    counters: set[str] = set()
    for node in ast.walk(ast.parse(expr, mode="eval")):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "counters"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            counters.add(node.slice.value.removesuffix(":n"))
        elif isinstance(node, ast.Name) and node.id != "counters":
            measures.add(node.id)
    return measures, counters


def metric_link(metric: Metric) -> MetricLink:
    """The requests behind ``metric``: the ones its numerator counts, when it counts requests
    with a feedback kind or failures; otherwise (latency, tokens, turns) every request."""
    name = metric.name
    if metric.kind == "quantile" or not metric.numerator:
        return MetricLink(name, note=f"{name} is a quantile of every request: a uniform sample is shown")
    measures, counters = _expression_names(metric.numerator)
    kinds = {_MEASURE_KINDS[m] for m in measures if m in _MEASURE_KINDS} | counters
    rest = measures - set(_MEASURE_KINDS) - _FAILURE_MEASURES
    if len(kinds) == 1 and not rest and not measures & _FAILURE_MEASURES:
        (kind,) = kinds
        return MetricLink(name, feedback=kind, note=f"responses that received '{kind}' feedback")
    if measures and measures <= _FAILURE_MEASURES and not counters:
        return MetricLink(name, error=True, note="requests that failed or were rescued by the fallback")
    return MetricLink(name, note=f"{name} averages over every request: a uniform sample is shown")


def find_metric(conn: Connection, name: str) -> Metric:
    if name in BUILTINS:
        return BUILTINS[name]
    if not name.isprintable():
        raise ExampleError("metric must be printable text (no control characters)")
    row = conn.execute(text("SELECT definition FROM metric_definitions WHERE name = :n"), {"n": name}).first()
    if row is None:
        raise ExampleError(f"unknown metric {name[:128]!r}")
    try:
        return parse_spec(row[0])
    except MetricError as exc:  # stored before a rule tightened: say so, not a 500
        raise ExampleError(f"metric {name!r} cannot be used: {exc}") from None


# --- queries -----------------------------------------------------------------------------------


_COLUMNS: Final = f"""
    i.event_id::text AS event_id, {_KEY} AS k, i.request_id, i.ts, i.variant, i.role, i.pair_id,
    i.category, i.tags, i.status, i.http_status, i.error_type, i.fallback, i.fallback_from,
    i.latency_ms, i.ttft_ms, i.prompt_tokens, i.completion_tokens, i.response_chars,
    i.finish_reason, i.model, i.stream,
    left(i.prompt, {TEXT_MAX}) AS prompt, length(i.prompt) AS prompt_length,
    left(i.response, {TEXT_MAX}) AS response, length(i.response) AS response_length,
    md5(i.response) AS response_md5"""


def _where(flt: ExampleFilter, params: dict[str, Any], role: str | None) -> str:
    clauses = ["i.experiment_id = :e", "i.variant = :v"]
    if role is not None:
        clauses.append("i.role = :role")
        params["role"] = role
    if flt.category is not None:
        clauses.append("i.category = :category")
        params["category"] = flt.category
    if flt.segment is not None:
        tag, _, value = flt.segment.partition("=")
        clauses.append("i.tags @> CAST(:segment AS jsonb)")
        params["segment"] = orjson.dumps({tag: value}).decode()
    if flt.error is True:
        clauses.append("(i.status = 'error' OR i.fallback)")
    elif flt.error is False:
        clauses.append("(i.status = 'ok' AND NOT i.fallback)")
    if flt.since is not None:
        clauses.append("i.ts >= :since")
        params["since"] = flt.since
    if flt.until is not None:
        clauses.append("i.ts < :until")
        params["until"] = flt.until
    if flt.feedback is not None:
        # Feedback is about the answer the user saw: the primary call's.
        clauses.append(
            "i.role = 'primary' AND EXISTS (SELECT 1 FROM feedback f"
            " WHERE f.request_id = i.request_id AND f.kind = :kind)"
        )
        params["kind"] = flt.feedback
    if flt.score_min is not None or flt.score_max is not None or flt.judge is not None:
        judged = ["j.request_id = i.request_id", "j.role = i.role", "j.score IS NOT NULL"]
        if flt.score_min is not None:
            judged.append("j.score >= :score_min")
            params["score_min"] = flt.score_min
        if flt.score_max is not None:
            judged.append("j.score <= :score_max")
            params["score_max"] = flt.score_max
        if flt.judge is not None:
            judged.append("j.judge = :judge")
            params["judge"] = flt.judge
        clauses.append(f"EXISTS (SELECT 1 FROM judgements j WHERE {' AND '.join(judged)})")
    return " AND ".join(clauses)


def _page(
    conn: Connection,
    eid: int,
    variants: list[str],
    flt: ExampleFilter,
    limit: int,
    cursor: tuple[int, str] | None,
    role: str | None,
) -> tuple[list[Any], bool]:
    """One page in hash order over ``variants`` (each an index range scan, merged here)."""
    rows: list[Any] = []
    # A budget for this transaction only (the connection goes back to the pool without it).
    conn.execute(text(f"SET LOCAL statement_timeout = {TIMEOUT_MS}"))
    for variant in variants:
        params: dict[str, Any] = {"e": eid, "v": variant, "n": limit + 1}
        where = _where(flt, params, role)
        if cursor is not None:
            where += f" AND ({_KEY}, i.event_id) > (:ck, CAST(:cid AS uuid))"
            params["ck"], params["cid"] = cursor
        sql = f"SELECT {_COLUMNS} FROM interactions i WHERE {where} ORDER BY {_KEY}, i.event_id LIMIT :n"
        try:
            rows.extend(conn.execute(text(sql), params).all())
        except OperationalError as exc:
            if isinstance(exc.orig, QueryCanceled):
                raise ExampleTimeout(TIMEOUT_REASON) from None
            raise
    rows.sort(key=lambda r: (r.k, uuid.UUID(r.event_id)))
    return rows[:limit], len(rows) > limit


def _content(row: Any, prefix: str, mode: str) -> dict[str, Any]:
    value = getattr(row, prefix)
    length = getattr(row, f"{prefix}_length")
    if mode == "none" or value is None:
        return {"state": "none" if value is None else "withheld", "text": None, "length": None}
    if mode == "hashed":
        if _SHA256.fullmatch(value) is None:
            # Logged while the setting was full: the current setting says no text.
            return {"state": "withheld", "text": None, "length": None}
        return {"state": "hashed", "text": value, "length": length}
    return {"state": "full", "text": value, "length": length, "truncated": length > len(value)}


def _attachments(
    conn: Connection, rows: list[Any]
) -> tuple[dict[str, list[Any]], dict[tuple[str, str], list[Any]]]:
    primary = [r.request_id for r in rows if r.role == "primary"]
    feedback: dict[str, list[Any]] = {}
    if primary:
        for rid, kind, value, ts in conn.execute(
            text(
                "SELECT request_id, kind, value, ts FROM feedback WHERE request_id = ANY(:ids)"
                " ORDER BY request_id, ts, event_id"
            ),
            {"ids": primary},
        ):
            items = feedback.setdefault(rid, [])
            if len(items) < MAX_ATTACHED:
                items.append({"kind": kind, "value": value, "ts": ts.isoformat()})
    judged: dict[tuple[str, str], list[Any]] = {}
    ids = list({r.request_id for r in rows})
    if ids:
        for rid, role, judge, score, status, error_type in conn.execute(
            text(
                "SELECT request_id, role, judge, score, status, error_type FROM judgements"
                " WHERE request_id = ANY(:ids) ORDER BY request_id, judge, ts"
            ),
            {"ids": ids},
        ):
            items = judged.setdefault((rid, role), [])
            if len(items) < MAX_ATTACHED:
                score = score if score is None or math.isfinite(score) else None
                items.append({"judge": judge, "score": score, "status": status, "error_type": error_type})
    return feedback, judged


def _item(
    row: Any, mode: str, feedback: dict[str, list[Any]], judged: dict[tuple[str, str], list[Any]]
) -> dict[str, Any]:
    return {
        "event_id": row.event_id,
        "request_id": row.request_id,
        "ts": row.ts.isoformat(),
        "variant": row.variant,
        "role": row.role,
        "pair_id": row.pair_id,
        "category": row.category,
        "tags": row.tags or {},
        "status": row.status,
        "http_status": row.http_status,
        "error_type": row.error_type,
        "fallback": row.fallback,
        "fallback_from": row.fallback_from,
        "latency_ms": row.latency_ms,
        "ttft_ms": row.ttft_ms,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "response_chars": row.response_chars,
        "finish_reason": row.finish_reason,
        "model": row.model,
        "stream": row.stream,
        "prompt": _content(row, "prompt", mode),
        "response": _content(row, "response", mode),
        "feedback": feedback.get(row.request_id, []) if row.role == "primary" else [],
        "judgements": judged.get((row.request_id, row.role), []),
    }


@dataclass(frozen=True, slots=True)
class Experiment:
    id: int
    name: str
    mode: str
    content_logging: str
    control: str | None
    variants: tuple[str, ...]


def load_experiment(conn: Connection, eid: int) -> Experiment:
    row = conn.execute(
        text("SELECT id, name, mode, content_logging FROM experiments WHERE id = :e"), {"e": eid}
    ).one()
    variants = conn.execute(
        text("SELECT name, is_control FROM variants WHERE experiment_id = :e ORDER BY id"), {"e": eid}
    ).all()
    control = next((v.name for v in variants if v.is_control), None)
    logging_mode = row.content_logging if row.content_logging in NOTES else "none"
    return Experiment(row.id, row.name, row.mode, logging_mode, control, tuple(v.name for v in variants))


def _variants(exp: Experiment, flt: ExampleFilter) -> list[str]:
    if flt.variant is None:
        return list(exp.variants)
    if flt.variant not in exp.variants:
        raise ExampleError(
            f"experiment {exp.name!r} has no variant {flt.variant[:64]!r} (variants: {', '.join(exp.variants)})"
        )
    return [flt.variant]


def _head(exp: Experiment) -> dict[str, Any]:
    return {
        "experiment": {"id": exp.id, "name": exp.name, "mode": exp.mode},
        "control": exp.control,
        "variants": list(exp.variants),
        "content_logging": exp.content_logging,
        "note": NOTES[exp.content_logging],
    }


def examples(
    conn: Connection,
    eid: int,
    flt: ExampleFilter,
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    metric: str | None = None,
) -> dict[str, Any]:
    """A page of sampled requests (see the module docstring); ``metric`` adds the filter of the
    requests behind that metric (an explicit filter of the same field wins)."""
    exp = load_experiment(conn, eid)
    link = None
    if metric is not None:
        link = metric_link(find_metric(conn, metric))
        flt = ExampleFilter(
            **{
                **{k: getattr(flt, k) for k in flt.__dataclass_fields__},
                "feedback": flt.feedback if flt.feedback is not None else link.feedback,
                "error": flt.error if flt.error is not None else link.error,
            }
        )
    flt.check()
    if not 1 <= limit <= MAX_LIMIT:
        raise ExampleError(f"limit must be between 1 and {MAX_LIMIT}")
    after = decode_cursor(cursor) if cursor is not None else None
    rows, more = _page(conn, eid, _variants(exp, flt), flt, limit, after, None)
    feedback, judged = _attachments(conn, rows)
    return {
        **_head(exp),
        "filter": flt.as_dict(),
        "metric": None if link is None else {"name": link.metric, "note": link.note},
        "order": "hash of the request id (a uniform sample, the same on every load)",
        "limit": limit,
        "items": [_item(r, exp.content_logging, feedback, judged) for r in rows],
        "next_cursor": encode_cursor(rows[-1].k, rows[-1].event_id) if more and rows else None,
    }


def shadow_pairs(
    conn: Connection, eid: int, flt: ExampleFilter, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None
) -> dict[str, Any]:
    """A page of shadow pairs in hash order of the shadow call: the primary answer (what the
    user saw) beside the shadow candidate's answer to the same request, with judge scores.
    The filters apply to the shadow call (its variant, its judgement, its failure)."""
    flt.check()
    if flt.feedback is not None:
        raise ExampleError("feedback is about the primary answer: filter the examples, not the shadow pairs")
    if not 1 <= limit <= MAX_LIMIT:
        raise ExampleError(f"limit must be between 1 and {MAX_LIMIT}")
    exp = load_experiment(conn, eid)
    after = decode_cursor(cursor) if cursor is not None else None
    # Only a shadow experiment mirrors calls, and only to its candidates: the control's (and
    # an A/B test's) index ranges hold no shadow call, and walking them would find none slowly.
    variants = [v for v in _variants(exp, flt) if v != exp.control] if exp.mode == "shadow" else []
    shadows, more = _page(conn, eid, variants, flt, limit, after, "shadow")
    primaries: dict[str, Any] = {}
    pair_ids = [s.pair_id for s in shadows if s.pair_id]
    if pair_ids:
        sql = (
            f"SELECT {_COLUMNS} FROM interactions i"
            " WHERE i.request_id = ANY(:ids) AND i.role = 'primary' AND i.experiment_id = :e"
        )
        for row in conn.execute(text(sql), {"ids": pair_ids, "e": eid}):
            primaries.setdefault(row.request_id, row)
    rows = shadows + list(primaries.values())
    feedback, judged = _attachments(conn, rows)
    pairs = []
    for s in shadows:
        p = primaries.get(s.pair_id or "")
        pairs.append(
            {
                "pair_id": s.pair_id,
                "category": s.category,
                "ts": s.ts.isoformat(),
                "primary": None if p is None else _item(p, exp.content_logging, feedback, judged),
                "shadow": _item(s, exp.content_logging, feedback, judged),
                "same_response": (
                    p is not None
                    and p.response is not None
                    and exp.content_logging != "none"
                    and p.response_md5 == s.response_md5
                    and p.response == s.response
                ),
            }
        )
    return {
        **_head(exp),
        "filter": flt.as_dict(),
        "order": "hash of the shadow call's request id (a uniform sample, the same on every load)",
        "limit": limit,
        "pairs": pairs,
        "next_cursor": encode_cursor(shadows[-1].k, shadows[-1].event_id) if more and shadows else None,
    }
