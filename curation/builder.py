"""Build a dataset version from production calls: filter, redact, de-duplicate, sample.

Steps, streamed in batches (memory grows with the items kept, never with the calls read):

1. the calls matching the spec (``curation.source``), only those with stored text
   (content logging ``full``; others are counted as ``without_text``);
2. the gateway's content redaction applied again (``curation.text.clean``);
3. exact duplicates dropped (same normalised prompt hash), then near-duplicates (MinHash
   estimate of Jaccard ≥ 0.8 with an item already kept, ``curation.minhash``);
4. with ``sample``: per category, a quota proportional to the category's matching calls
   (largest remainder; ``stratify: none`` = one stratum), filled in a seeded random order
   — duplicates are skipped, so a quota is short only when the category runs out;
5. each kept item carries its provenance (request id, experiment, variant, category,
   feedback kinds, time), any user reference, and a preference pair when there is one:
   for a regenerated answer the answer the user kept vs the regenerated one (the user's
   own choice, used first); else for a call with judged shadow mirrors the side the judge
   prefers by at least ``source.JUDGE_MARGIN`` points unless the user's signal on the
   answer they saw contradicts it (``source.judged_preference``; the widest gap when
   several mirrors qualify).

The version is written in one transaction (all or nothing) with its content hash and an
audit record.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, insert, select, text

from curation import minhash, source
from curation.audit import audit
from curation.source import Row
from curation.spec import CurationError, CurationSpec, check_name
from curation.tables import Dataset, DatasetVersion
from curation.text import clean, normalise, text_hash

#: Feedback that says the logged answer is not one to learn from.
NEGATIVE_KINDS = frozenset({"thumbs_down", "regenerate", "edit"})


@dataclass(frozen=True, slots=True)
class VersionInfo:
    dataset: str
    dataset_id: int
    version: int
    version_id: int
    content_hash: str
    item_count: int
    stats: dict[str, Any]


def quotas(counts: dict[str, int], n: int) -> dict[str, int]:
    """Largest-remainder allocation of ``n`` over strata proportional to ``counts`` (ties by
    name), never more than a stratum holds."""
    total = sum(counts.values())
    if total == 0:
        return {}
    if n >= total:
        return dict(counts)
    exact = {k: n * c / total for k, c in counts.items()}
    out = {k: min(counts[k], math.floor(v)) for k, v in exact.items()}
    rest = n - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - math.floor(exact[k])), k)):
        if rest <= 0:
            break
        if out[k] < counts[k]:
            out[k] += 1
            rest -= 1
    return out


def item_digest(item: dict[str, Any]) -> bytes:
    """What an item's content hash covers (its canonical JSON, sorted keys)."""
    core = {k: item[k] for k in ("item_id", "category", "split", "prompt", "response", "reference", "pair")}
    return hashlib.sha256(orjson.dumps(core, option=orjson.OPT_SORT_KEYS)).digest()


@dataclass(slots=True)
class _Selection:
    """Kept items' hashes and signatures, and why calls were dropped."""

    seen: set[str] = field(default_factory=set)
    index: minhash.LshIndex = field(default_factory=minhash.LshIndex)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "matched": 0,
            "without_text": 0,
            "exact_duplicates": 0,
            "near_duplicates": 0,
            "kept": 0,
            "truncated": 0,
            "pairs": 0,
            "judged_pairs": 0,
            "judge_ties": 0,
            "judge_vetoed": 0,
            "references": 0,
        }
    )

    def take(self, batch: list[Row], room: int | None) -> list[tuple[Row, str, str | None, str, bool]]:
        """(row, prompt, response, text hash, truncated) of the batch's new items, at most ``room``."""
        self.stats["matched"] += len(batch)
        fresh: list[tuple[Row, str, str | None, str, str, bool]] = []
        for row in batch:
            if room is not None and len(fresh) >= room * 2 + 16:
                break  # enough candidates for what is left; the rest of the batch is not needed
            if not row.has_text:
                self.stats["without_text"] += 1
                continue
            prompt, cut = clean(row.prompt or "")
            response, cut_r = clean(row.response) if row.response is not None else (None, False)
            norm = normalise(prompt)
            digest = text_hash(norm)
            if digest in self.seen:
                self.stats["exact_duplicates"] += 1
                continue
            self.seen.add(digest)
            fresh.append((row, prompt, response, digest, norm, cut or cut_r))
        out: list[tuple[Row, str, str | None, str, bool]] = []
        sigs = minhash.signatures([f[4] for f in fresh])
        bands = minhash.band_keys_many(sigs) if sigs else []
        for (row, prompt, response, digest, _norm, cut), sig, keys in zip(fresh, sigs, bands, strict=True):
            if room is not None and len(out) >= room:
                self.seen.discard(digest)  # not kept: a later call with this text may be
                continue
            if self.index.add_unless_near(digest, sig, keys) is not None:
                self.stats["near_duplicates"] += 1
                continue
            out.append((row, prompt, response, digest, cut))
        self.stats["kept"] += len(out)
        return out

    def signature(self, digest: str) -> bytes:
        return minhash.to_bytes(self.index.signature(digest))


def _streams(read: Connection, exp: source.Experiment, spec: CurationSpec, counts: dict[str, int],
             kept: dict[str, int]) -> Iterator[tuple[list[Row], str | None, dict[str, int] | None]]:  # fmt: skip
    """Batches with the stratum they belong to and the quotas (None without sampling); a
    stratum's stream stops as soon as ``kept`` (updated by the caller) fills its quota."""
    if not spec.sample:
        with contextlib.closing(source.rows(read, exp, spec)) as stream:
            for batch in stream:
                yield batch, None, None
        return
    strata = {"*": sum(counts.values())} if spec.stratify == "none" else counts
    want = quotas(strata, spec.sample)
    for category in sorted(want):
        only = None if category == "*" else category
        # Pages of the stratum's seeded order: most quotas fill from the first page, and a
        # page is a bounded top-N sort in PostgreSQL, not a sort of every matching call.
        page, offset = 2 * want[category] + 256, 0
        while kept.get(category, 0) < want[category]:
            seen = 0
            with contextlib.closing(
                source.rows(read, exp, spec, category=only, limit=page, offset=offset)
            ) as stream:
                for batch in stream:
                    seen += len(batch)
                    if kept.get(category, 0) >= want[category]:
                        break
                    yield batch, category, want
            if seen < page:
                break  # the stratum ran out (or its quota filled)
            offset += page


def create_version(
    engine: Engine, name: str, spec: CurationSpec, actor: str, description: str | None = None
) -> VersionInfo:
    """Curate a new version of dataset ``name`` (created when new) from production calls."""
    check_name(name)
    started = time.monotonic()
    with engine.connect() as read:
        exp = source.experiment(read, spec.experiment)
        source.require_full_content(exp)
        # The per-category counts only size a sample's quotas: without a sample, the stream
        # itself says whether anything matched (one pass over the calls instead of two).
        counts = source.counts(read, exp, spec) if spec.sample else {}
        if spec.sample and not counts:
            raise CurationError(f"no call of experiment {exp.name!r} matches these filters")
        sel = _Selection()
        kept_per: dict[str, int] = {}
        with engine.begin() as write:
            ds_id, version = _new_version(write, name, actor, description)
            version_id = write.execute(
                insert(DatasetVersion).values(dataset_id=ds_id, version=version, content_hash="", item_count=0,
                                              spec=spec.as_json(), created_by=actor).returning(DatasetVersion.id)
            ).scalar_one()  # fmt: skip
            digest = hashlib.sha256()
            position = 0
            for batch, stratum, want in _streams(read, exp, spec, counts, kept_per):
                room = None if want is None or stratum is None else want[stratum] - kept_per.get(stratum, 0)
                taken = sel.take(batch, room)
                if stratum is not None:
                    kept_per[stratum] = kept_per.get(stratum, 0) + len(taken)
                rows = _items(read, exp, version_id, taken, position, sel)
                for item in rows:
                    digest.update(item_digest(item))
                if rows:
                    copy_items(write, rows)
                position += len(rows)
            if sel.stats["matched"] == 0:
                raise CurationError(f"no call of experiment {exp.name!r} matches these filters")
            if position == 0:
                raise CurationError(
                    f"none of the {sel.stats['matched']} matching calls has stored text "
                    f"({sel.stats['without_text']} without text): nothing to curate"
                )
            stats: dict[str, Any] = dict(sel.stats)
            if spec.sample:
                short = {k: v - kept_per.get(k, 0) for k, v in quotas(
                    counts if spec.stratify == "category" else {"*": sum(counts.values())}, spec.sample).items()
                         if v > kept_per.get(k, 0)}  # fmt: skip
                stats["quota_short"] = short
            stats["categories"] = dict(sorted(_category_counts(write, version_id).items()))
            stats["seconds"] = round(time.monotonic() - started, 3)
            stats["near_duplicate_threshold"] = minhash.THRESHOLD
            content_hash = digest.hexdigest()
            write.execute(text("UPDATE dataset_versions SET content_hash = :h, item_count = :n,"
                               " stats = CAST(:s AS jsonb) WHERE id = :v"),
                          {"h": content_hash, "n": position, "s": orjson.dumps(stats).decode(), "v": version_id})  # fmt: skip
            audit(write, actor, "create_dataset_version", name,
                  after={"version": version, "content_hash": content_hash, "items": position, "spec": spec.as_json()})  # fmt: skip
    return VersionInfo(name, ds_id, version, version_id, content_hash, position, stats)


_ITEM_COLUMNS = ("version_id", "item_id", "position", "category", "split", "text_hash", "minhash", "prompt",
                 "response", "reference", "pair", "provenance")  # fmt: skip
_JSON_COLUMNS = frozenset({"reference", "pair", "provenance"})


def copy_items(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert items with COPY on the transaction's own connection (several times faster than
    row-by-row inserts: no per-row statement, JSON encoded by orjson)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(f"COPY dataset_items ({', '.join(_ITEM_COLUMNS)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([
                (None if row[c] is None else orjson.dumps(row[c]).decode()) if c in _JSON_COLUMNS else row[c]
                for c in _ITEM_COLUMNS
            ])  # fmt: skip


def _new_version(conn: Connection, name: str, actor: str, description: str | None) -> tuple[int, int]:
    """The dataset's id (created when new) and its next version number; serialised per name."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('liftgate.dataset:' || :n))"), {"n": name})
    ds_id = conn.execute(select(Dataset.id).where(Dataset.name == name)).scalar()
    if ds_id is None:
        ds_id = conn.execute(insert(Dataset).values(name=name, description=description, created_by=actor)
                             .returning(Dataset.id)).scalar_one()  # fmt: skip
    last = conn.execute(
        text("SELECT max(version) FROM dataset_versions WHERE dataset_id = :d"), {"d": ds_id}
    ).scalar()
    return int(ds_id), int(last or 0) + 1


def _items(read: Connection, exp: source.Experiment, version_id: int,
           taken: list[tuple[Row, str, str | None, str, bool]], position: int, sel: _Selection) -> list[dict[str, Any]]:  # fmt: skip
    refs = source.references(read, [t[0].request_id for t in taken])
    pairs = source.regenerations(read, exp, [t[0] for t in taken if "regenerate" in t[0].kinds])
    shadows = source.shadow_pairs(read, exp, [t[0].request_id for t in taken if t[2]])
    out = []
    for k, (row, prompt, response, digest, cut) in enumerate(taken):
        reference = dict(refs.get(row.request_id, {}))
        if row.rating is not None and "rating" not in reference:
            reference["rating"] = float(row.rating)
        if "text" in reference:
            reference["text"] = clean(str(reference["text"]))[0]
        pair = None
        kept = pairs.get(row.request_id)
        if kept is not None and response:
            pair = {"source": "regenerated", "chosen": clean(kept.response or "")[0], "rejected": response,
                    "chosen_request_id": kept.request_id, "rejected_request_id": row.request_id}  # fmt: skip
        elif response and row.request_id in shadows:
            pair = _judged_pair(row, response, shadows[row.request_id], sel.stats)
        if pair is not None:
            sel.stats["pairs"] += 1
        sel.stats["references"] += bool(reference)
        provenance: dict[str, Any] = {
            "request_id": row.request_id, "experiment": exp.name, "experiment_id": exp.id, "variant": row.variant,
            "category": row.category, "feedback": list(row.kinds), "status": row.status, "ts": row.ts.isoformat(),
            "unit_id": hashlib.sha256(row.unit_id.encode()).hexdigest()[:16],
        }  # fmt: skip
        if row.conversation_id:
            provenance["conversation_id"] = row.conversation_id
        if row.judge_score is not None:
            provenance["judge_score"] = float(row.judge_score)
        if cut:
            provenance["truncated"] = True
            sel.stats["truncated"] += 1
        out.append({"version_id": version_id, "item_id": row.request_id, "position": position + k,
                    "category": row.category[:64], "split": "none", "text_hash": digest,
                    "minhash": sel.signature(digest), "prompt": prompt, "response": response,
                    "reference": reference or None, "pair": pair, "provenance": provenance})  # fmt: skip
    return out


def _judged_pair(
    row: Row, response: str, sides: list[source.ShadowSide], stats: dict[str, int]
) -> dict[str, Any] | None:
    """The preference pair of a primary call from its judged shadow mirrors (or None)."""
    best: tuple[float, dict[str, Any]] | None = None
    for side in sides:
        winner = source.judged_preference(side.primary_score, side.shadow_score, row.kinds)
        if winner is None:
            tied = abs(side.shadow_score - side.primary_score) < source.JUDGE_MARGIN
            stats["judge_ties" if tied else "judge_vetoed"] += 1
            continue
        shadow = clean(side.response)[0]
        primary = {
            "text": response,
            "request_id": row.request_id,
            "variant": row.variant,
            "score": side.primary_score,
        }
        mirror = {
            "text": shadow,
            "request_id": side.request_id,
            "variant": side.variant,
            "score": side.shadow_score,
        }
        chosen, rejected = (mirror, primary) if winner == "shadow" else (primary, mirror)
        gap = abs(side.shadow_score - side.primary_score)
        if best is None or gap > best[0]:
            best = (gap, {"source": "judged_shadow", "judge": side.judge, "chosen": chosen["text"],
                          "rejected": rejected["text"], "chosen_request_id": chosen["request_id"],
                          "rejected_request_id": rejected["request_id"], "chosen_variant": chosen["variant"],
                          "rejected_variant": rejected["variant"], "chosen_score": chosen["score"],
                          "rejected_score": rejected["score"],
                          "user_agrees": _user_agrees(winner, row.kinds)})  # fmt: skip
    if best is not None:
        stats["judged_pairs"] += 1
        return best[1]
    return None


def _user_agrees(winner: str, kinds: tuple[str, ...]) -> bool | None:
    """Whether the user's signal on the answer they saw backs the judge (None: no signal)."""
    said = set(kinds)
    if winner == "shadow" and said & source.DISLIKED_KINDS:
        return True
    if winner == "primary" and said & source.POSITIVE_KINDS:
        return True
    return None


def _category_counts(conn: Connection, version_id: int) -> dict[str, int]:
    rows = conn.execute(text("SELECT category, count(*) FROM dataset_items WHERE version_id = :v GROUP BY 1"),
                        {"v": version_id}).all()  # fmt: skip
    return {str(r[0]): int(r[1]) for r in rows}
