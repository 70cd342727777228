"""What events the database refuses cost a batch: clean vs 1 vs 5 refused, wall time.

No Kafka: batches of N interaction events (``bench_ingest.make_events``), decoded already,
written with ``analytics.ingest.write.ingest_raw`` on one connection, as the consumer does. A
refused event has an id of UUID length the database cannot read as a UUID (the contract
checks an event id's length only), so the database refuses it in the batch. Each case runs
``--reps`` times on fresh events (interleaved), medians printed; "one by one" times the
isolation ingest used before (every event of the batch in its own savepoint) for scale.

    .venv/bin/python bench/ingest/bench_poison.py --batch 2000 --reps 7
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import ADMIN_URL, make_events, scratch_database

from analytics.ingest import rollups, write
from contracts.events import InteractionEvent, encode


def _raws(events: list[InteractionEvent]) -> list[write.Raw]:
    return [write.Raw(encode(e), "bench", 0, i, e.key, e) for i, e in enumerate(events)]


def _batch(n: int, refused: int, rng: random.Random) -> list[write.Raw]:
    events = make_events(n, n // 4, seed=rng.randrange(1 << 30))
    for i in rng.sample(range(n), refused):
        events[i].event_id = "zzzzzzzz-zzzz-zzzz-zzzz-" + f"{i:012d}"
    return _raws(events)


def _one_by_one(pg: psycopg.Connection[Any], raws: list[write.Raw]) -> None:
    with pg.transaction():
        for raw in raws:
            try:
                with pg.transaction():
                    write._fast_or_safe(pg, [raw], [], rollups.NONE_DECLARED, nested=True, cuts=None)
            except psycopg.DataError:
                pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(1)
    cases = {"clean": 0, "1 refused": 1, "5 refused": 5}
    times: dict[str, list[float]] = {name: [] for name in [*cases, "1 refused, one by one (before)"]}
    with scratch_database(args.admin_url, "lg_bench_poison") as url, psycopg.connect(url) as pg:
        write.ingest_raw(pg, [], [])  # the session's temp tables, as in a running consumer
        for _ in range(args.reps):
            for name, k in cases.items():
                raws = _batch(args.batch, k, rng)
                t0 = time.perf_counter()
                res = write.ingest_raw(pg, raws, [])
                times[name].append(time.perf_counter() - t0)
                assert res.dead_lettered == k and res.interactions == args.batch - k
            raws = _batch(args.batch, 1, rng)
            t0 = time.perf_counter()
            _one_by_one(pg, raws)
            pg.commit()
            times["1 refused, one by one (before)"].append(time.perf_counter() - t0)
    clean = statistics.median(times["clean"])
    print(f"batch of {args.batch} interactions, median of {args.reps}:")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:32s} {m * 1000:8.1f} ms  ({m / clean:5.2f} x clean)")


if __name__ == "__main__":
    main()
