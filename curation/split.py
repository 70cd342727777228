"""Sealed holdout: a split version whose ``holdout`` items are never exported for training.

``split`` makes a new version from a parent that has not been split: within each category,
items in the order of SHA-256(seed:item id), the first round(fraction × n) (half up) go to
``holdout`` (a category with one item stays in ``eval``), the rest to ``eval``. Seeded and
independent of item order, so the same seed gives the same split. A split version cannot be
split again: a new split would move holdout items into ``eval``.
"""

from __future__ import annotations

import hashlib

import orjson
from sqlalchemy import Engine, insert, text

from curation import store
from curation.audit import audit
from curation.builder import VersionInfo, item_digest
from curation.db import stream
from curation.spec import CurationError
from curation.tables import DatasetVersion


def assign(ids_by_category: dict[str, list[str]], fraction: float, seed: int) -> dict[str, str]:
    """item id -> 'eval' | 'holdout' (pure)."""
    if not 0 < fraction < 1:
        raise CurationError("the holdout fraction must be between 0 and 1 (exclusive)")
    out: dict[str, str] = {}
    for ids in ids_by_category.values():
        ordered = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        n_hold = int(fraction * len(ordered) + 0.5) if len(ordered) > 1 else 0  # half up
        n_hold = min(n_hold, len(ordered) - 1)
        for k, item in enumerate(ordered):
            out[item] = "holdout" if k < n_hold else "eval"
    return out


def split(engine: Engine, ref: str, fraction: float, seed: int, actor: str) -> VersionInfo:
    with engine.begin() as conn:
        parent = store.version(conn, ref)
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext('liftgate.dataset:' || :n))"), {"n": parent.dataset}
        )
        if parent.split:
            raise CurationError(f"{parent.dataset}@{parent.version} is already split: its holdout is sealed")
        rows = conn.execute(text("SELECT item_id, category FROM dataset_items WHERE version_id = :v"),
                            {"v": parent.version_id}).all()  # fmt: skip
        by_cat: dict[str, list[str]] = {}
        for item_id, category in rows:
            by_cat.setdefault(str(category), []).append(str(item_id))
        labels = assign(by_cat, fraction, seed)
        number = int(conn.execute(text("SELECT max(version) FROM dataset_versions WHERE dataset_id = :d"),
                                  {"d": parent.dataset_id}).scalar_one()) + 1  # fmt: skip
        spec = {
            "split_of": parent.version,
            "holdout_fraction": fraction,
            "seed": seed,
            "stratify": "category",
        }
        vid = conn.execute(insert(DatasetVersion).values(
            dataset_id=parent.dataset_id, version=number, parent_version=parent.version, content_hash="",
            item_count=parent.item_count, spec=spec, created_by=actor).returning(DatasetVersion.id)).scalar_one()  # fmt: skip
        conn.execute(text(
            "INSERT INTO dataset_items (version_id, item_id, position, category, split, text_hash, minhash, prompt,"
            " response, reference, pair, provenance) SELECT :nv, i.item_id, i.position, i.category,"
            " (CAST(:labels AS jsonb) ->> i.item_id), i.text_hash, i.minhash, i.prompt, i.response, i.reference,"
            " i.pair, i.provenance FROM dataset_items i WHERE i.version_id = :v"),
            {"nv": vid, "v": parent.version_id, "labels": orjson.dumps(labels).decode()})  # fmt: skip
        digest = hashlib.sha256()
        result = stream(conn, 5000, text(
            "SELECT item_id, category, split, prompt, response, reference, pair FROM dataset_items"
            " WHERE version_id = :v ORDER BY position"), {"v": vid})  # fmt: skip
        for r in result:
            digest.update(item_digest(dict(zip(("item_id", "category", "split", "prompt", "response", "reference",
                                                "pair"), r, strict=True))))  # fmt: skip
        content_hash = digest.hexdigest()
        held = sum(1 for v in labels.values() if v == "holdout")
        stats = {"eval": len(labels) - held, "holdout": held}
        conn.execute(text("UPDATE dataset_versions SET content_hash = :h, stats = CAST(:s AS jsonb) WHERE id = :v"),
                     {"h": content_hash, "s": orjson.dumps(stats).decode(), "v": vid})  # fmt: skip
        audit(conn, actor, "split_dataset", parent.dataset,
              after={"version": number, "parent_version": parent.version, "content_hash": content_hash, **stats,
                     "seed": seed, "holdout_fraction": fraction})  # fmt: skip
    return VersionInfo(
        parent.dataset, parent.dataset_id, number, int(vid), content_hash, parent.item_count, stats
    )
