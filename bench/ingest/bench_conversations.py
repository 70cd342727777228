"""The conversation probe of ingest as conversations grow (no Kafka).

Each batch of the COPY fast path asks which of its (experiment, conversation) pairs have a
primary turn stored already (a conversation is counted once, on its first turn). This
bench stores C conversations turn by turn — batch t holds turn t of every conversation —
and times that probe for the C pairs after 1, 10, 25 and 50 stored turns, with the query
of ``analytics.ingest.write.rows`` and with the one before session 4 (read every stored turn of the
conversation, ``DISTINCT experiment_id``), alternated in the same run.

    .venv/bin/python bench/ingest/bench_conversations.py --conversations 2000 --turns 50
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import ADMIN_URL, make_events, scratch_database

from analytics.ingest import copy_text, rollups, write

BEFORE = (
    b"SELECT x.experiment_id, c.id FROM unnest(%s::text[]) c(id) CROSS JOIN LATERAL ("
    b" SELECT DISTINCT i.experiment_id FROM interactions i"
    b" WHERE i.conversation_id = c.id AND i.role = 'primary' AND i.experiment_id IS NOT NULL) x"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--conversations", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    c, turns = args.conversations, args.turns
    template = make_events(c * turns, c)
    checkpoints = sorted({1, 10, 25, turns} & set(range(1, turns + 1)))
    convs = [f"conv-{k}" for k in range(c)]
    exps = "{" + ",".join("1" for _ in convs) + "}"
    with scratch_database(args.admin_url, "lg_bench_conv") as url, psycopg.connect(url) as pg:
        write._prepare(pg, nested=False)
        pg.commit()
        for t in range(1, turns + 1):
            batch = [
                dataclasses.replace(template[(t - 1) * c + k], conversation_id=convs[k], unit_id=f"user-{k}")
                for k in range(c)
            ]
            with pg.transaction():
                if copy_text.insert_interactions(pg, batch, declared=rollups.NONE_DECLARED).attributable:
                    rollups.fold_interactions(pg)
            if t not in checkpoints:
                continue
            pg.execute(b"ANALYZE interactions")
            pg.commit()
            times: dict[str, list[float]] = {"now": [], "before": []}
            for _ in range(args.repeats):
                for name in ("before", "now"):
                    t0 = time.perf_counter()
                    if name == "now":
                        rows = pg.execute(
                            copy_text._STORED_CONVERSATIONS, (exps, copy_text.text_array(convs))
                        ).fetchall()
                    else:
                        rows = pg.execute(BEFORE, (copy_text.text_array(convs),)).fetchall()
                    times[name].append(time.perf_counter() - t0)
                    if len(rows) != c:
                        raise RuntimeError(f"{name}: {len(rows)} stored conversations found, expected {c}")
                pg.commit()
            now, before = statistics.median(times["now"]), statistics.median(times["before"])
            print(
                f"{t:3d} turns stored: probe of {c:,} conversations {now * 1e3:7.1f} ms now,"
                f" {before * 1e3:7.1f} ms before ({before / now:.1f}x);"
                f" {now / c * 1e6:.1f} vs {before / c * 1e6:.1f} µs per conversation"
            )


if __name__ == "__main__":
    main()
