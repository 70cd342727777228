"""Streaming JSONL exports of a version, and the holdout guard for training exports.

Formats (one JSON object per line):

* ``chat`` — OpenAI chat fine-tuning: ``{"messages": [user, assistant]}``. The assistant
  turn is the user's corrected text (an ``edit`` reference) when there is one, else the
  logged answer only if nobody disliked it (no thumbs-down, regenerate or edit, no error);
  other items are skipped and counted.
* ``preference`` — OpenAI preference fine-tuning: ``{"input": {"messages": [user]},
  "preferred_output": [assistant], "non_preferred_output": [assistant]}`` from items with a
  pair — the answer kept after a regenerate vs the regenerated one, or the side of a judged
  shadow pair the judge prefers (the user not contradicting it, ``curation.source``) — or
  an edit (the edited text vs the logged answer); others are skipped and counted.
* ``eval`` — liftgate's eval item format (docs/evals.md), with a scorer from the reference:
  the user's verifiable check when given, else an LLM-judge rubric (with the corrected text
  as its reference when there is one). Provenance goes in ``metadata``.

``chat`` and ``preference`` are **training** exports: they never contain a holdout item,
and one that would contain an item equal to, or a near-duplicate of, any holdout item of any
dataset is refused — nothing is written, the refusal is recorded with the overlapping ids.
Items are read with a server-side cursor in batches: memory does not grow with the version.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

import orjson
from sqlalchemy import Connection, Engine, insert, text

from curation import minhash, store
from curation.audit import audit
from curation.builder import NEGATIVE_KINDS
from curation.db import stream
from curation.spec import CurationError
from curation.tables import DatasetExport

Format = Literal["chat", "preference", "eval"]
FORMATS: tuple[str, ...] = ("chat", "preference", "eval")
TRAINING: frozenset[str] = frozenset({"chat", "preference"})
JUDGE_RUBRIC = (
    "Does the response answer the user's request correctly and helpfully? A real user disliked an "
    "earlier answer to this request; judge the response on its own merits."
)
_CATEGORY_BAD = re.compile(r"[^a-z0-9_]")
#: Overlapping ids listed in a refusal's message (all are in the export record).
SHOWN_OVERLAPS = 20


class HoldoutLeak(CurationError):
    def __init__(self, overlaps: list[dict[str, str]]) -> None:
        shown = ", ".join(
            f"{o['item_id']} ({o['match']} of {o['holdout']})" for o in overlaps[:SHOWN_OVERLAPS]
        )
        more = f" and {len(overlaps) - SHOWN_OVERLAPS} more" if len(overlaps) > SHOWN_OVERLAPS else ""
        super().__init__(f"refused: {len(overlaps)} item(s) overlap a sealed holdout: {shown}{more}")
        self.overlaps = overlaps


@dataclass(frozen=True, slots=True)
class ExportResult:
    dataset: str
    version: int
    format: str
    split: str
    items: int
    skipped: int
    content_hash: str


def eval_category(category: str) -> str:
    out = _CATEGORY_BAD.sub("_", category.lower())[:64]
    return out if out[:1].isalpha() else ("c_" + out)[:64]


def chat_line(item: dict[str, Any]) -> dict[str, Any] | None:
    ref = item["reference"] or {}
    answer = ref.get("text")
    prov = item["provenance"]
    if (
        answer is None
        and item["response"]
        and prov.get("status") == "ok"
        and not NEGATIVE_KINDS & set(prov.get("feedback", ()))
    ):
        answer = item["response"]
    if not answer:
        return None
    return {
        "messages": [{"role": "user", "content": item["prompt"]}, {"role": "assistant", "content": answer}]
    }


def preference_line(item: dict[str, Any]) -> dict[str, Any] | None:
    ref = item["reference"] or {}
    pair = item["pair"]
    if pair is not None:
        chosen, rejected = pair["chosen"], pair["rejected"]
    elif ref.get("text") and item["response"] and ref["text"] != item["response"]:
        chosen, rejected = ref["text"], item["response"]
    else:
        return None
    return {"input": {"messages": [{"role": "user", "content": item["prompt"]}]},
            "preferred_output": [{"role": "assistant", "content": chosen}],
            "non_preferred_output": [{"role": "assistant", "content": rejected}]}  # fmt: skip


def eval_line(item: dict[str, Any]) -> dict[str, Any]:
    ref = item["reference"] or {}
    scorer: dict[str, Any]
    if ref.get("check"):
        scorer = dict(ref["check"])
    else:
        scorer = {"type": "judge", "rubric": JUDGE_RUBRIC, "threshold": 7}
        if ref.get("text"):
            scorer["reference"] = ref["text"]
    line: dict[str, Any] = {"id": item["item_id"], "category": eval_category(item["category"]), "prompt": item["prompt"],
                            "scorer": scorer, "metadata": {**item["provenance"], "split": item["split"]}}  # fmt: skip
    if ref.get("text"):
        line["reference"] = ref["text"]
    if "rating" in ref:
        line["metadata"]["user_rating"] = ref["rating"]
    return line


_LINES = {"chat": chat_line, "preference": preference_line, "eval": eval_line}
_COLUMNS = ("item_id", "category", "split", "prompt", "response", "reference", "pair", "provenance")


def _splits(fmt: str, split: str | None, has_split: bool) -> tuple[str, ...]:
    if fmt in TRAINING:
        if split == "holdout":
            raise CurationError("holdout items are never exported for training (chat, preference)")
        return ("eval",) if has_split else ("none",)
    if split is None:
        return ("eval",) if has_split else ("none",)
    if split not in ("eval", "holdout"):
        raise CurationError("split must be eval or holdout")
    if not has_split:
        raise CurationError("this version is not split: export it without --split")
    return (split,)


def items(
    conn: Connection, version_id: int, splits: tuple[str, ...], batch: int = 2000
) -> Iterator[dict[str, Any]]:
    result = stream(conn, batch,
        text(f"SELECT {', '.join(_COLUMNS)} FROM dataset_items WHERE version_id = :v AND split = ANY(:s)"
             " ORDER BY position"), {"v": version_id, "s": list(splits)})  # fmt: skip
    try:
        for row in result:
            yield dict(zip(_COLUMNS, row, strict=True))
    finally:
        result.close()


def holdout_overlaps(conn: Connection, version_id: int, splits: tuple[str, ...]) -> list[dict[str, str]]:
    """Items of the export equal to (same normalised hash) or near-duplicates of a holdout
    item of any dataset: [{item_id, holdout: 'dataset@N:item', match: 'hash'|'near-duplicate'}]."""
    hashes: dict[str, str] = {}
    index = minhash.LshIndex()
    held = stream(conn, 5000, text(
        "SELECT i.text_hash, i.minhash, d.name || '@' || v.version || ':' || i.item_id FROM dataset_items i"
        " JOIN dataset_versions v ON v.id = i.version_id JOIN datasets d ON d.id = v.dataset_id"
        " WHERE i.split = 'holdout'"))  # fmt: skip
    for digest, sig, label in held:
        hashes.setdefault(str(digest), str(label))
        index.add(str(label), minhash.from_bytes(bytes(sig)))
    if not hashes:
        return []
    out: list[dict[str, str]] = []
    rows = stream(conn, 5000, text(
        "SELECT item_id, text_hash, minhash FROM dataset_items WHERE version_id = :v AND split = ANY(:s)"
        " ORDER BY position"), {"v": version_id, "s": list(splits)})  # fmt: skip
    for item_id, digest, sig in rows:
        same = hashes.get(str(digest))
        if same is not None:
            out.append({"item_id": str(item_id), "holdout": same, "match": "hash"})
            continue
        near = index.near(minhash.from_bytes(bytes(sig)), first_only=True)
        if near:
            out.append({"item_id": str(item_id), "holdout": near[0], "match": "near-duplicate"})
    return out


def export(
    engine: Engine, ref: str, fmt: str, out: IO[bytes], actor: str, split: str | None = None
) -> ExportResult:
    """Write the version's items as JSONL to ``out`` (streamed), recorded and audited."""
    if fmt not in FORMATS:
        raise CurationError(f"format must be one of {', '.join(FORMATS)}")
    with engine.connect() as conn:
        ver = store.version(conn, ref)
        splits = _splits(fmt, split, ver.split)
        label = splits[0] if splits != ("none",) else "all"
        if fmt in TRAINING:
            overlaps = holdout_overlaps(conn, ver.version_id, splits)
            if overlaps:
                with engine.begin() as write:
                    write.execute(insert(DatasetExport).values(
                        version_id=ver.version_id, format=fmt, split=label, status="refused", actor=actor,
                        detail={"overlaps": overlaps}))  # fmt: skip
                    audit(write, actor, "export_refused", ver.dataset,
                          after={"version": ver.version, "format": fmt, "overlapping_ids": [o["item_id"] for o in overlaps]})  # fmt: skip
                raise HoldoutLeak(overlaps)
        digest = hashlib.sha256()
        written = skipped = 0
        make = _LINES[fmt]
        for item in items(conn, ver.version_id, splits):
            line = make(item)
            if line is None:
                skipped += 1
                continue
            data = orjson.dumps(line) + b"\n"
            digest.update(data)
            out.write(data)
            written += 1
        result = ExportResult(ver.dataset, ver.version, fmt, label, written, skipped, digest.hexdigest())
    with engine.begin() as write:
        write.execute(insert(DatasetExport).values(
            version_id=ver.version_id, format=fmt, split=label, status="written", item_count=written, skipped=skipped,
            content_hash=result.content_hash, actor=actor))  # fmt: skip
        audit(write, actor, "export_dataset", ver.dataset,
              after={"version": ver.version, "format": fmt, "split": label, "items": written, "skipped": skipped,
                     "content_hash": result.content_hash})  # fmt: skip
    return result
