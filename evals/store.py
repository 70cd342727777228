"""The offline evals' tables: the one module that writes them (contracts.tables, eval_*), plus
the reads of experiments, variants and upstreams the runner needs. Gate declarations and
decisions are control-plane state: written through ``control.gates``."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert

from contracts.tables import (
    EvalDataset,
    EvalDatasetItem,
    EvalOutputCache,
    EvalResult,
    EvalRun,
    Experiment,
    GateDecision,
    Upstream,
    Variant,
)
from control import gates
from evals.datasets.loaders import Dataset


class StoreError(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class Target:
    """One model to evaluate: an experiment variant's upstream and model."""

    variant: str | None
    upstream: str
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    is_control: bool = False


@dataclass(frozen=True, slots=True)
class ExperimentInfo:
    id: int
    name: str
    targets: tuple[Target, ...]

    @property
    def control(self) -> Target:
        found = [t for t in self.targets if t.is_control]
        if len(found) != 1:
            raise StoreError(f"experiment {self.name!r} has {len(found)} control variants (needs exactly 1)")
        return found[0]

    @property
    def candidates(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if not t.is_control)


@dataclass(frozen=True, slots=True)
class ResultRow:
    item_id: str
    sample: int
    category: str
    output: str | None
    error: str | None
    passed: bool
    score: float
    reason: str
    latency_ms: float | None
    cached: bool


@dataclass(frozen=True, slots=True)
class CachedOutput:
    output: str
    finish_reason: str | None
    latency_ms: float | None
    scorer_version: str | None
    passed: bool | None
    score: float | None
    reason: str | None


def experiment(conn: Connection, ref: str) -> ExperimentInfo:
    """An experiment by name or id, with its variants' upstreams."""
    cond = Experiment.name == ref
    if ref.isdigit():
        cond = cond | (Experiment.id == int(ref))
    row = conn.execute(select(Experiment.id, Experiment.name).where(cond)).first()
    if row is None:
        raise StoreError(f"no experiment {ref!r}")
    rows = conn.execute(
        select(
            Variant.name,
            Variant.model,
            Variant.is_control,
            Upstream.name,
            Upstream.base_url,
            Upstream.api_key,
            Upstream.timeout_s,
        )
        .join(Upstream, Upstream.id == Variant.upstream_id)
        .where(Variant.experiment_id == row.id)
        .order_by(Variant.id)
    ).all()
    targets = tuple(Target(r[0], r[3], r[4], r[1], r[5], float(r[6]), bool(r[2])) for r in rows)
    return ExperimentInfo(int(row.id), str(row.name), targets)


def save_dataset(conn: Connection, dataset: Dataset) -> int:
    """Register (or refresh) a dataset by name; its items are replaced when it changed.
    Serialised per name (a transaction lock), so concurrent runs cannot both insert it."""
    conn.execute(
        text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(sha256("dataset:" + dataset.name))}
    )
    fingerprint = dataset.fingerprint()
    current = conn.execute(
        select(EvalDataset.id, EvalDataset.fingerprint).where(EvalDataset.name == dataset.name)
    ).first()
    if current is not None and current.fingerprint == fingerprint:
        return int(current.id)
    values = {"source": dataset.source, "fingerprint": fingerprint, "item_count": len(dataset.items)}
    if current is None:
        dataset_id = int(conn.execute(insert(EvalDataset).values(name=dataset.name, **values)
                                      .returning(EvalDataset.id)).scalar_one())  # fmt: skip
    else:
        dataset_id = int(current.id)
        conn.execute(
            update(EvalDataset).where(EvalDataset.id == dataset_id).values(**values, updated_at=func.now())
        )
        conn.execute(delete(EvalDatasetItem).where(EvalDatasetItem.dataset_id == dataset_id))
    conn.execute(insert(EvalDatasetItem), [
        {"dataset_id": dataset_id, "item_id": i.id, "category": i.category, "fingerprint": i.fingerprint(),
         "item": i.to_json()} for i in dataset.items
    ])  # fmt: skip
    return dataset_id


def dataset_id(conn: Connection, name: str) -> tuple[int, str] | None:
    row = conn.execute(
        select(EvalDataset.id, EvalDataset.fingerprint).where(EvalDataset.name == name)
    ).first()
    return (int(row.id), str(row.fingerprint)) if row else None


def advisory_key(run_key: str) -> int:
    return int(run_key[:15], 16)


def open_run(conn: Connection, *, run_key: str, dataset_id: int, dataset_fingerprint: str,
             experiment_id: int | None, target: Target, params: dict[str, Any], fingerprint: str,
             samples: int, items: int) -> tuple[int, str]:  # fmt: skip
    """The run to work on for ``run_key``: the newest one (to resume or reuse), or a new one.
    Returns (run id, its status before this call)."""
    row = conn.execute(
        select(EvalRun.id, EvalRun.status)
        .where(EvalRun.run_key == run_key)
        .order_by(EvalRun.id.desc())
        .limit(1)
    ).first()
    if row is not None:
        if row.status != "completed":
            conn.execute(
                update(EvalRun).where(EvalRun.id == row.id).values(status="running", finished_at=None)
            )
        return int(row.id), str(row.status)
    run_id = conn.execute(
        insert(EvalRun).values(
            run_key=run_key, dataset_id=dataset_id, dataset_fingerprint=dataset_fingerprint,
            experiment_id=experiment_id, variant=target.variant, upstream=target.upstream,
            base_url=target.base_url, model=target.model, params=params, fingerprint=fingerprint,
            samples=samples, items=items, status="running",
        ).returning(EvalRun.id)
    ).scalar_one()  # fmt: skip
    return int(run_id), "new"


def reopen_run(conn: Connection, run_id: int) -> None:
    conn.execute(delete(EvalResult).where(EvalResult.run_id == run_id))
    conn.execute(update(EvalRun).where(EvalRun.id == run_id).values(status="running", finished_at=None))


def done_results(conn: Connection, run_id: int) -> set[tuple[str, int]]:
    rows = conn.execute(
        select(EvalResult.item_id, EvalResult.sample).where(
            EvalResult.run_id == run_id, EvalResult.error.is_(None)
        )
    )
    return {(str(r[0]), int(r[1])) for r in rows}


def cached_outputs(conn: Connection, keys: Sequence[str]) -> dict[str, CachedOutput]:
    c = EvalOutputCache
    out: dict[str, CachedOutput] = {}
    for start in range(0, len(keys), 2000):
        rows = conn.execute(
            select(
                c.key, c.output, c.finish_reason, c.latency_ms, c.scorer_version, c.passed, c.score, c.reason
            ).where(c.key.in_(keys[start : start + 2000]))
        )
        for r in rows:
            out[r[0]] = CachedOutput(*r[1:])
    return out


#: Stored outputs are cut here (one character past what any scorer reads, so a cached
#: output that was too long stays too long).
MAX_STORED_CHARS = 100_001


def storable(text_: str | None) -> str | None:
    """Text PostgreSQL accepts (no NUL) and of bounded size."""
    if text_ is None:
        return None
    return text_[:MAX_STORED_CHARS].replace("\x00", "\ufffd")


def write_cache(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    batch = [{**r, "output": storable(r["output"]), "reason": storable(r["reason"])} for r in rows]
    if batch:
        stmt = insert(EvalOutputCache)
        conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={
            c: stmt.excluded[c] for c in ("output", "finish_reason", "latency_ms", "scorer_version", "passed",
                                          "score", "reason")}), batch)  # fmt: skip


def write_results(conn: Connection, run_id: int, rows: Iterable[ResultRow]) -> None:
    batch = [{"run_id": run_id, "item_id": r.item_id, "sample": r.sample, "category": r.category,
              "output": storable(r.output), "error": storable(r.error), "passed": r.passed, "score": r.score,
              "reason": storable(r.reason),
              "latency_ms": r.latency_ms, "cached": r.cached} for r in rows]  # fmt: skip
    if batch:
        stmt = insert(EvalResult)
        keep = ("category", "output", "error", "passed", "score", "reason", "latency_ms", "cached")
        conn.execute(stmt.on_conflict_do_update(index_elements=["run_id", "item_id", "sample"],
                                                set_={c: stmt.excluded[c] for c in keep}), batch)  # fmt: skip


def finish_run(conn: Connection, run_id: int, status: str) -> dict[str, Any]:
    """Close a run with its summary (per category: items, passed, errors) computed in SQL."""
    rows = conn.execute(
        text("SELECT category, count(*), count(*) FILTER (WHERE passed), count(*) FILTER (WHERE error IS NOT NULL)"
             " FROM eval_results WHERE run_id = :r GROUP BY category ORDER BY category"), {"r": run_id}
    ).all()  # fmt: skip
    categories = {r[0]: {"outputs": r[1], "passed": r[2], "errors": r[3]} for r in rows}
    summary = {"categories": categories, "outputs": sum(c["outputs"] for c in categories.values()),
               "passed": sum(c["passed"] for c in categories.values()),
               "errors": sum(c["errors"] for c in categories.values())}  # fmt: skip
    conn.execute(update(EvalRun).where(EvalRun.id == run_id)
                 .values(status=status, summary=summary, finished_at=func.now()))  # fmt: skip
    return summary


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: int
    variant: str | None
    dataset: str
    fingerprint: str
    status: str
    samples: int
    summary: dict[str, Any]
    started_at: Any


def latest_run(conn: Connection, experiment_id: int, variant: str, dataset: str, fingerprint: str | None = None,
               samples: int | None = None) -> RunRecord | None:  # fmt: skip
    query = (
        select(
            EvalRun.id,
            EvalRun.variant,
            EvalDataset.name,
            EvalRun.fingerprint,
            EvalRun.status,
            EvalRun.samples,
            EvalRun.summary,
            EvalRun.started_at,
        )
        .join(EvalDataset, EvalDataset.id == EvalRun.dataset_id)
        .where(
            EvalRun.experiment_id == experiment_id,
            EvalRun.variant == variant,
            EvalDataset.name == dataset,
            EvalRun.dataset_fingerprint == EvalDataset.fingerprint,
        )
        .order_by(EvalRun.id.desc())
        .limit(1)
    )
    if fingerprint is not None:
        query = query.where(EvalRun.fingerprint == fingerprint)
    if samples is not None:
        query = query.where(EvalRun.samples == samples)
    row = conn.execute(query).first()
    return RunRecord(*row) if row else None


def runs_of(conn: Connection, experiment_id: int) -> list[RunRecord]:
    """The newest run of each (variant, dataset) of an experiment."""
    rows = conn.execute(text(
        "SELECT DISTINCT ON (r.variant, d.name) r.id, r.variant, d.name, r.fingerprint, r.status, r.samples,"
        " r.summary, r.started_at FROM eval_runs r JOIN eval_datasets d ON d.id = r.dataset_id"
        " WHERE r.experiment_id = :e ORDER BY r.variant, d.name, r.id DESC"), {"e": experiment_id}).all()  # fmt: skip
    return [RunRecord(*r) for r in rows]


def run_outcomes(conn: Connection, run_id: int) -> tuple[dict[str, tuple[str, float]], int]:
    """Per item: (category, share of its samples that passed); and how many calls failed."""
    rows = conn.execute(text(
        "SELECT item_id, min(category), avg(passed::int), count(*) FILTER (WHERE error IS NOT NULL)"
        " FROM eval_results WHERE run_id = :r GROUP BY item_id"), {"r": run_id}).all()  # fmt: skip
    return {str(r[0]): (str(r[1]), float(r[2])) for r in rows}, sum(int(r[3]) for r in rows)


def failing_items(
    conn: Connection, baseline_run: int, candidate_run: int, limit: int
) -> list[dict[str, Any]]:
    """Items (first sample) the baseline passed and the candidate failed, with both outputs."""
    rows = conn.execute(text(
        "SELECT c.item_id, c.category, b.output, c.output, c.reason FROM eval_results c"
        " JOIN eval_results b ON b.run_id = :b AND b.item_id = c.item_id AND b.sample = c.sample"
        " WHERE c.run_id = :c AND c.sample = 0 AND b.passed AND NOT c.passed ORDER BY c.category, c.item_id"
        " LIMIT :n"), {"b": baseline_run, "c": candidate_run, "n": limit}).all()  # fmt: skip
    return [{"item_id": r[0], "category": r[1], "baseline_output": r[2], "candidate_output": r[3], "reason": r[4]}
            for r in rows]  # fmt: skip


# Declarations and decisions are written by the control plane (one writer, one lock, one audit).
declaration = gates.declaration
set_declaration = gates.set_declaration
save_decision = gates.save_decision


def decisions(conn: Connection, experiment_id: int, limit: int = 10) -> list[dict[str, Any]]:
    table = GateDecision.__table__
    rows = conn.execute(
        select(table).where(table.c.experiment_id == experiment_id).order_by(table.c.id.desc()).limit(limit)
    )
    return [dict(r._mapping) for r in rows]


@contextlib.contextmanager
def run_lock(engine: Engine, run_key: str) -> Iterator[bool]:
    """Hold the session advisory lock of ``run_key`` (one runner per run) for the block;
    yields False when another process holds it. Unlocked explicitly: a pooled connection's
    session, and so its lock, outlives ``close()``."""
    key = advisory_key(run_key)
    with engine.connect() as conn:
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


def sha256(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()
