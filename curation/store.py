"""Datasets as stored: list, show, resolve a version, delete; user references; retention.

The one writer of the curation tables (with ``curation.builder``, ``curation.split`` and
``curation.export`` for the rows they create).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection, insert, text

from curation.audit import audit
from curation.spec import CurationError, NotFound

MAX_REFERENCE_TEXT = 100_000


@dataclass(frozen=True, slots=True)
class VersionRef:
    dataset: str
    dataset_id: int
    version: int
    version_id: int
    content_hash: str
    item_count: int
    split: bool


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@VERSION`` (``v`` prefix allowed)."""
    name, sep, ver = ref.partition("@")
    if not sep:
        return name, None
    ver = ver.removeprefix("v")
    if not ver.isdigit() or int(ver) < 1:
        raise CurationError(f"bad version in {ref!r}: NAME@N with N ≥ 1")
    return name, int(ver)


def version(conn: Connection, ref: str) -> VersionRef:
    """A version by ``NAME[@N]`` (default: the newest)."""
    name, number = parse_ref(ref)
    query = (
        "SELECT d.name, d.id, v.version, v.id, v.content_hash, v.item_count,"
        " EXISTS (SELECT 1 FROM dataset_items i WHERE i.version_id = v.id AND i.split <> 'none')"
        " FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id WHERE d.name = :n"
        + (" AND v.version = :v" if number is not None else "")
        + " ORDER BY v.version DESC LIMIT 1"
    )
    row = conn.execute(text(query), {"n": name, "v": number}).first()
    if row is None:
        raise NotFound(f"no dataset {ref!r}")
    return VersionRef(
        str(row[0]), int(row[1]), int(row[2]), int(row[3]), str(row[4]), int(row[5]), bool(row[6])
    )


def datasets(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(text(
        "SELECT d.name, d.description, d.created_by, d.created_at, d.expires_at, v.version, v.item_count,"
        " v.content_hash FROM datasets d LEFT JOIN LATERAL (SELECT version, item_count, content_hash FROM"
        " dataset_versions WHERE dataset_id = d.id ORDER BY version DESC LIMIT 1) v ON true ORDER BY d.name"
    )).all()  # fmt: skip
    return [{"name": r[0], "description": r[1], "created_by": r[2], "created_at": r[3].isoformat(),
             "expires_at": r[4].isoformat() if r[4] else None, "latest_version": r[5], "items": r[6],
             "content_hash": r[7]} for r in rows]  # fmt: skip


def show(conn: Connection, name: str) -> dict[str, Any]:
    ds = conn.execute(text("SELECT id, name, description, created_by, created_at, expires_at FROM datasets"
                           " WHERE name = :n"), {"n": name}).first()  # fmt: skip
    if ds is None:
        raise NotFound(f"no dataset {name!r}")
    versions = conn.execute(text(
        "SELECT v.id, v.version, v.parent_version, v.content_hash, v.item_count, v.spec, v.stats, v.created_by,"
        " v.created_at FROM dataset_versions v WHERE v.dataset_id = :d ORDER BY v.version"), {"d": ds[0]}).all()  # fmt: skip
    splits = conn.execute(text(
        "SELECT i.version_id, i.split, i.category, count(*) FROM dataset_items i JOIN dataset_versions v"
        " ON v.id = i.version_id WHERE v.dataset_id = :d GROUP BY 1, 2, 3"), {"d": ds[0]}).all()  # fmt: skip
    exports = conn.execute(text(
        "SELECT v.version, e.format, e.split, e.status, e.item_count, e.skipped, e.content_hash, e.actor,"
        " e.created_at FROM dataset_exports e JOIN dataset_versions v ON v.id = e.version_id"
        " WHERE v.dataset_id = :d ORDER BY e.id"), {"d": ds[0]}).all()  # fmt: skip
    by_version: dict[int, dict[str, dict[str, int]]] = {}
    for vid, split, category, n in splits:
        by_version.setdefault(int(vid), {}).setdefault(str(split), {})[str(category)] = int(n)
    return {
        "name": ds[1], "description": ds[2], "created_by": ds[3], "created_at": ds[4].isoformat(),
        "expires_at": ds[5].isoformat() if ds[5] else None,
        "versions": [{"version": v[1], "parent_version": v[2], "content_hash": v[3], "items": v[4], "spec": v[5],
                      "stats": v[6], "created_by": v[7], "created_at": v[8].isoformat(),
                      "splits": by_version.get(int(v[0]), {})} for v in versions],
        "exports": [{"version": e[0], "format": e[1], "split": e[2], "status": e[3], "items": e[4], "skipped": e[5],
                     "content_hash": e[6], "actor": e[7], "created_at": e[8].isoformat()} for e in exports],
    }  # fmt: skip


def delete(conn: Connection, name: str, actor: str) -> dict[str, int]:
    """Delete a dataset: its versions, items, export records and stored replays (cascade), audited."""
    ds_id = conn.execute(text("SELECT id FROM datasets WHERE name = :n FOR UPDATE"), {"n": name}).scalar()
    if ds_id is None:
        raise NotFound(f"no dataset {name!r}")
    row = conn.execute(text("SELECT :d, count(*), coalesce(sum(item_count), 0) FROM dataset_versions"
                            " WHERE dataset_id = :d"), {"d": ds_id}).one()  # fmt: skip
    exports = conn.execute(text("SELECT count(*) FROM dataset_exports e JOIN dataset_versions v ON v.id ="
                                " e.version_id WHERE v.dataset_id = :d"), {"d": row[0]}).scalar_one()  # fmt: skip
    replayed = conn.execute(text("SELECT count(*) FROM dataset_replays r JOIN dataset_versions v ON v.id ="
                                 " r.version_id WHERE v.dataset_id = :d"), {"d": row[0]}).scalar_one()  # fmt: skip
    conn.execute(text("DELETE FROM datasets WHERE id = :d"), {"d": row[0]})
    removed = {
        "versions": int(row[1]),
        "items": int(row[2]),
        "exports": int(exports),
        "replays": int(replayed),
    }
    audit(conn, actor, "delete_dataset", name, before=removed)
    return removed


def set_expiry(conn: Connection, name: str, expires_at: datetime | None, actor: str) -> None:
    found = conn.execute(text("UPDATE datasets SET expires_at = :t WHERE name = :n RETURNING id"),
                         {"t": expires_at, "n": name}).first()  # fmt: skip
    if found is None:
        raise NotFound(f"no dataset {name!r}")
    audit(
        conn,
        actor,
        "set_dataset_expiry",
        name,
        after={"expires_at": expires_at.isoformat() if expires_at else None},
    )


def add_reference(conn: Connection, request_id: str, kind: str, actor: str, *, text_: str | None = None,
                  check: dict[str, Any] | None = None, value: float | None = None) -> int:  # fmt: skip
    """Store what a user gave as the right answer to a response (validated; audited)."""
    from evals.items import EvalItem

    if not request_id or len(request_id) > 64 or any(ord(c) < 32 for c in request_id):
        raise CurationError("request_id must be 1-64 characters without control characters")
    if kind == "edit":
        if not text_ or len(text_) > MAX_REFERENCE_TEXT or "\x00" in text_:
            raise CurationError(f"an edit reference needs 'text' (1-{MAX_REFERENCE_TEXT} characters, no NUL)")
        check, value = None, None
    elif kind == "task_success":
        if not isinstance(check, dict):
            raise CurationError(
                "a task_success reference needs 'check': a scorer spec (answer, regex, json_schema, ...)"
            )
        try:
            EvalItem.model_validate({"id": "x", "category": "chat", "prompt": "x", "scorer": check})
        except ValueError as exc:
            raise CurationError(f"'check' is not a valid scorer spec: {exc}") from None
        text_, value = None, None
    elif kind == "rating":
        if value is None or isinstance(value, bool) or not math.isfinite(value) or not 0 <= value <= 10:
            raise CurationError("a rating reference needs 'value' between 0 and 10")
        text_, check = None, None
    else:
        raise CurationError("kind must be edit, task_success or rating")
    from curation.tables import FeedbackReference

    ref_id = conn.execute(insert(FeedbackReference).values(request_id=request_id, kind=kind, text=text_, check=check,
                                                           value=value, actor=actor)
                          .returning(FeedbackReference.id)).scalar_one()  # fmt: skip
    audit(conn, actor, "add_reference", request_id, entity="feedback_reference",
          after={"kind": kind, "id": int(ref_id), "has_text": text_ is not None})  # fmt: skip
    return int(ref_id)


def record_replay(conn: Connection, ver: VersionRef, experiment_id: int, runs: tuple[int, int], judge: str,
                  result: dict[str, Any], actor: str) -> int:  # fmt: skip
    """Store one replay's result (``curation.replay.Replay.to_json``): ``runs`` = the
    baseline's and the candidate's eval run ids. Audited; returns its id."""
    overall = result["overall"]
    rid = conn.execute(text(
        "INSERT INTO dataset_replays (version_id, experiment_id, baseline, candidate, baseline_run_id,"
        " candidate_run_id, judge, items, failed, overall, categories, actor) VALUES (:v, :e, :b, :c, :br, :cr, :j,"
        " :n, :f, CAST(:o AS jsonb), CAST(:cat AS jsonb), :a) RETURNING id"),
        {"v": ver.version_id, "e": experiment_id, "b": result["baseline"], "c": result["candidate"], "br": runs[0],
         "cr": runs[1], "j": judge[:256], "n": int(overall["n"]), "f": int(result["failed"]),
         "o": _json(overall), "cat": _json(result["categories"]), "a": actor}).scalar_one()  # fmt: skip
    audit(conn, actor, "record_replay", ver.dataset,
          after={"version": ver.version, "replay_id": int(rid), "candidate": result["candidate"],
                 "baseline": result["baseline"], "items": int(overall["n"]), "rate": _finite(overall["rate"]),
                 "lc_rate": _finite(overall["lc_rate"])})  # fmt: skip
    return int(rid)


def replays(conn: Connection, name: str) -> list[dict[str, Any]]:
    """The stored replays of a dataset's versions, newest first."""
    if conn.execute(text("SELECT 1 FROM datasets WHERE name = :n"), {"n": name}).first() is None:
        raise NotFound(f"no dataset {name!r}")
    rows = conn.execute(text(
        "SELECT r.id, v.version, e.name, r.baseline, r.candidate, r.baseline_run_id, r.candidate_run_id, r.judge,"
        " r.items, r.failed, r.overall, r.categories, r.actor, r.created_at FROM dataset_replays r"
        " JOIN dataset_versions v ON v.id = r.version_id JOIN datasets d ON d.id = v.dataset_id"
        " LEFT JOIN experiments e ON e.id = r.experiment_id WHERE d.name = :n ORDER BY r.id DESC"), {"n": name}).all()  # fmt: skip
    return [{"id": r[0], "version": r[1], "experiment": r[2], "baseline": r[3], "candidate": r[4],
             "baseline_run_id": r[5], "candidate_run_id": r[6], "judge": r[7], "items": r[8], "failed": r[9],
             "overall": r[10], "categories": r[11], "actor": r[12], "created_at": r[13].isoformat()} for r in rows]  # fmt: skip


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def _json(value: Any) -> str:
    """JSON for a jsonb column: NaN and ±inf (a degenerate fit) become null, which jsonb accepts."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
