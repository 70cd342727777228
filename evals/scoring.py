"""Score a file of outputs against a dataset, without calling any model (``liftgate eval score``).

Outputs are JSON lines ``{"id": ..., "output": "..."}`` (``task_id``/``completion`` as in
HumanEval's samples, or ``response`` as in IFEval's, are accepted too); a line's id follows
the dataset rule (``id`` or ``task_id``, else its 0-based line number). Several lines with
one id are several samples of that item (pass@k). An item with no output fails; an output
for no item is an error (a typo in ids must not silently shrink the denominator).
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from evals.datasets.loaders import Dataset, DatasetError, item_id, read_jsonl
from evals.scorers import Score, ScoringContext, score_async
from evals.stats import pass_at_k

OUTPUT_KEYS = ("output", "completion", "response")


@dataclass(frozen=True, slots=True)
class ScoredOutput:
    item_id: str
    category: str
    sample: int
    score: Score
    has_output: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"id": self.item_id, "category": self.category, "sample": self.sample,
                "passed": self.score.passed, "score": self.score.score, "reason": self.score.reason}  # fmt: skip


def read_outputs(path: Path) -> list[tuple[str, str]]:
    """(item id, output) per line, in file order."""
    out: list[tuple[str, str]] = []
    for number, row in read_jsonl(path):
        key = next((k for k in OUTPUT_KEYS if k in row), None)
        if key is None or not isinstance(row[key], str):
            raise DatasetError(f"{path}:{number + 1}: needs a string 'output' (or 'completion'/'response')")
        out.append((item_id(row, number), row[key]))
    return out


async def score_outputs_async(
    dataset: Dataset, outputs: list[tuple[str, str]], ctx: ScoringContext, workers: int | None = None
) -> list[ScoredOutput]:
    items = dataset.by_id()
    unknown = sorted({i for i, _ in outputs if i not in items})
    if unknown:
        raise DatasetError(
            f"outputs for ids not in the dataset: {unknown[:10]}{' …' if len(unknown) > 10 else ''}"
        )
    slots = asyncio.Semaphore(workers or os.cpu_count() or 2)
    samples: dict[str, int] = defaultdict(int)
    jobs: list[tuple[str, int]] = []
    for iid, _ in outputs:
        jobs.append((iid, samples[iid]))
        samples[iid] += 1
    async with aiohttp.ClientSession() as session:
        scores = await asyncio.gather(
            *(score_async(items[iid], text, ctx, session, slots) for iid, text in outputs)
        )
    scored = [
        ScoredOutput(iid, items[iid].category, sample, s)
        for (iid, sample), s in zip(jobs, scores, strict=True)
    ]
    missing = [i for i in dataset.items if i.id not in samples]
    scored += [ScoredOutput(i.id, i.category, 0, Score.fail("no output"), has_output=False) for i in missing]
    return scored


def score_outputs(
    dataset: Dataset,
    outputs: list[tuple[str, str]],
    ctx: ScoringContext | None = None,
    workers: int | None = None,
) -> list[ScoredOutput]:
    return asyncio.run(score_outputs_async(dataset, outputs, ctx or ScoringContext(), workers))


def summarize(scored: list[ScoredOutput]) -> dict[str, Any]:
    """Per item: passed when its first sample passed (pass@1 with one sample); pass@k from all
    samples when some item has several."""
    by_item: dict[str, list[ScoredOutput]] = defaultdict(list)
    for s in scored:
        by_item[s.item_id].append(s)
    categories: dict[str, list[bool]] = defaultdict(list)
    for rows in by_item.values():
        first = min(rows, key=lambda r: r.sample)
        categories[first.category].append(first.score.passed)
    summary: dict[str, Any] = {
        "items": len(by_item),
        "outputs": sum(1 for s in scored if s.has_output),
        "missing": sum(1 for s in scored if not s.has_output),
        "passed": sum(sum(v) for v in categories.values()),
        "pass_rate": sum(sum(v) for v in categories.values()) / max(1, len(by_item)),
        "categories": {
            c: {"items": len(v), "passed": sum(v), "pass_rate": sum(v) / len(v)}
            for c, v in sorted(categories.items())
        },
    }
    n_min = min(len(rows) for rows in by_item.values()) if by_item else 0
    if n_min > 1:
        summary["pass_at_k"] = {
            f"pass@{k}": sum(pass_at_k(len(r), sum(x.score.passed for x in r), k) for r in by_item.values())
            / len(by_item)
            for k in (1, 5, 10, 100)
            if k <= n_min
        }
    return summary
