"""Offline replay of a production dataset: its prompts as an eval dataset for the offline
gate's runner, then pairwise judging of each candidate against the baseline.

Each item's two outputs (baseline and candidate, from the runs the runner stored) go to the
judge in both orders (``judge_pairwise``): a win counts only when both orders agree, else a
tie. An item where either call failed or the judge could not be asked is left out and
counted (``failed``), never scored as a win.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from sqlalchemy import Connection, Engine, text

from curation import export, store
from curation.spec import CurationError
from curation.winrate import CategoryWinRate, WinRate, by_category, win_rate
from evals.datasets.loaders import Dataset
from evals.items import EvalItem
from evals.scorers.judge import Endpoint, judge_pairwise

PREFIX = "production:"
PAIRWISE_RUBRIC = "helpfulness, correctness and honesty; length alone is not a quality"


def is_production(ref: str) -> bool:
    return ref.startswith(PREFIX)


def load(conn: Connection, ref: str) -> Dataset:
    """``production:NAME[@N]`` as an eval dataset: the ``eval`` split of a split version
    (the holdout stays sealed), else every item."""
    ver = store.version(conn, ref.removeprefix(PREFIX))
    splits = ("eval",) if ver.split else ("none",)
    items = tuple(
        EvalItem.model_validate(export.eval_line(i)) for i in export.items(conn, ver.version_id, splits)
    )
    if not items:
        raise CurationError(f"{ver.dataset}@{ver.version} has no items to replay")
    return Dataset(
        f"{PREFIX}{ver.dataset}@{ver.version}", f"dataset {ver.dataset} version {ver.version}", items
    )


@dataclass(frozen=True, slots=True)
class Replay:
    candidate: str
    baseline: str
    overall: WinRate
    categories: list[CategoryWinRate]
    failed: int

    def to_json(self) -> dict[str, Any]:
        def one(w: WinRate) -> dict[str, Any]:
            return {k: getattr(w, k) for k in w.__dataclass_fields__}

        return {"candidate": self.candidate, "baseline": self.baseline, "failed": self.failed,
                "overall": one(self.overall),
                "categories": [{"category": c.category, **one(c.result), "p_holm": c.p_holm, "lc_p_holm": c.lc_p_holm}
                               for c in self.categories]}  # fmt: skip


def _outputs(conn: Connection, run_id: int) -> dict[str, str | None]:
    rows = conn.execute(text("SELECT item_id, output, error FROM eval_results WHERE run_id = :r AND sample = 0"),
                        {"r": run_id}).all()  # fmt: skip
    return {str(r[0]): (None if r[2] is not None else r[1]) for r in rows}


def _chunks(seq: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


async def pairwise(engine: Engine, dataset: Dataset, baseline: tuple[str, int], candidate: tuple[str, int],
                   judge: Endpoint, concurrency: int = 16) -> Replay:  # fmt: skip
    """Judge every item's two outputs; win rates overall and per category (Holm)."""
    with engine.connect() as conn:
        base_out, cand_out = _outputs(conn, baseline[1]), _outputs(conn, candidate[1])
    todo = [(i, base_out.get(i.id), cand_out.get(i.id)) for i in dataset.items]
    failed = sum(1 for _, b, c in todo if not (b is not None and c is not None))
    pairs = [(i, b, c) for i, b, c in todo if b is not None and c is not None]
    slots = asyncio.Semaphore(concurrency)
    outcomes: dict[str, float] = {}

    async with aiohttp.ClientSession() as session:

        async def one(item: EvalItem, base: str, cand: str) -> None:
            async with slots:
                verdict, _ = await judge_pairwise(
                    session, judge, item.prompt_text(), cand, base, PAIRWISE_RUBRIC
                )
            outcomes[item.id] = {"a": 1.0, "b": 0.0}.get(verdict, 0.5)

        for part in _chunks(pairs, 1000):
            await asyncio.gather(*(one(i, b, c) for i, b, c in part))
    groups: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for item, base, cand in pairs:
        g = groups.setdefault(item.category, ([], [], []))
        g[0].append(outcomes[item.id])
        g[1].append(float(len(cand)))
        g[2].append(float(len(base)))
    all_y = [y for g in groups.values() for y in g[0]]
    all_c = [x for g in groups.values() for x in g[1]]
    all_b = [x for g in groups.values() for x in g[2]]
    return Replay(candidate[0], baseline[0], win_rate(all_y, all_c, all_b), by_category(groups), failed)


def dumps(replay: Replay) -> str:
    return orjson.dumps(replay.to_json(), option=orjson.OPT_SERIALIZE_NUMPY).decode()


def judge_label(judge: Endpoint) -> str:
    """The judge as recorded with a replay: its model and URL without credentials or query."""
    parts = urlsplit(judge.base_url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{judge.model} @ {urlunsplit((parts.scheme, netloc, parts.path, '', ''))}"


def record(engine: Engine, dataset: Dataset, experiment_id: int, runs: tuple[int, int], judge: Endpoint,
           replay: Replay, actor: str) -> int:  # fmt: skip
    """Store a replay's result with the version it replayed (``dataset.name`` is
    ``production:NAME@N``), so it can be read afterwards (``liftgate datasets replays``)."""
    with engine.begin() as conn:
        ver = store.version(conn, dataset.name.removeprefix(PREFIX))
        return store.record_replay(
            conn, ver, experiment_id, runs, judge_label(judge), replay.to_json(), actor
        )
