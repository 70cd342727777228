"""Examples side by side on 1M interactions: a page of sampled requests, per filter.

Builds a scratch database (``liftgate_bench_examples``, migrated with the project's Alembic
revisions), fills it in SQL with ``generate_series``, and times
``analytics.report.examples.examples`` / ``shadow_pairs`` (what the API calls) for each kind
of page, median of N runs, with the load average before and after. Side by side, the same
first page read without the examples index (``enable_indexscan`` off: the rows of the
variant are found some other way and sorted by the hash), to show what the index buys.

    .venv/bin/python bench/report/bench_examples.py            # generate (~2 min) + measure
    .venv/bin/python bench/report/bench_examples.py --reuse    # measure again
    .venv/bin/python bench/report/bench_examples.py --drop     # … and drop the database
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Connection, create_engine, text

from analytics.report.examples import ExampleFilter, examples, shadow_pairs
from bench.report.scratch import log, scratch_database

DB_NAME = os.environ.get("LIFTGATE_BENCH_EXAMPLES_DB", "liftgate_bench_examples")
CHUNK = 250_000
START = datetime(2026, 11, 1, tzinfo=UTC)
SPAN_S = 30 * 86400

# One shadow experiment's traffic: 90% of calls on the control, 10% on the candidate as
# primaries (an A/B split), plus every 20th control call mirrored to the candidate as a
# shadow call. 3% of calls fail; text ~80 characters; a `task` tag and a category.
INTERACTIONS_SQL = """
INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source,
    role, pair_id, mode, endpoint, model, upstream, status, http_status, error_type, latency_ms,
    prompt_tokens, completion_tokens, response_chars, stream, fallback, tags, prompt, response, category)
SELECT md5('e' || g)::uuid, %(start)s::timestamptz + make_interval(secs => g * %(step)s),
       md5('r' || g), 'assistant', %(eid)s,
       CASE WHEN g %% 20 = 7 THEN 'candidate' WHEN g %% 10 = 3 THEN 'candidate' ELSE 'control' END,
       'u' || (g %% 100000), 'header',
       CASE WHEN g %% 20 = 7 THEN 'shadow' ELSE 'primary' END,
       CASE WHEN g %% 20 = 7 THEN md5('r' || (g - 1)) END,
       'shadow', 'chat', 'm', 'sim',
       CASE WHEN g %% 33 = 0 THEN 'error' ELSE 'ok' END, CASE WHEN g %% 33 = 0 THEN 502 ELSE 200 END,
       CASE WHEN g %% 33 = 0 THEN 'http_5xx' END, 200 + (g %% 997), 50, 120, 480, false, false,
       jsonb_build_object('task', (ARRAY['code', 'math', 'chat'])[1 + g %% 3]),
       'question ' || g || ' about something a user asked the assistant to do today',
       CASE WHEN g %% 33 <> 0 THEN 'answer ' || g || ' with a few words of text that a model wrote back' END,
       (ARRAY['code', 'math', 'chat', 'other'])[1 + (g / 3) %% 4]
FROM generate_series(%(lo)s, %(hi)s - 1) g
"""
# 5% of primary answers get a thumbs-down, 10% a thumbs-up; 30% of calls are judged.
FEEDBACK_SQL = """
INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, experiment_id, variant, tags)
SELECT md5(kind || request_id)::uuid, ts + interval '5 s', request_id, unit_id, kind, 1, experiment_id, variant, '{}'
FROM interactions i, LATERAL (VALUES ('thumbs_down', 20), ('thumbs_up', 10)) k(kind, every)
WHERE role = 'primary' AND status = 'ok' AND abs(hashtext(request_id || kind)) %% every = 0
"""
JUDGEMENTS_SQL = """
INSERT INTO judgements (event_id, ts, request_id, unit_id, judge, role, status, latency_ms, experiment_id,
    variant, pair_id, category, score)
SELECT md5('j' || request_id)::uuid, ts + interval '2 s', request_id, unit_id, 'judge-a', role, 'ok', 100,
       experiment_id, variant, pair_id, category, (abs(hashtext(request_id)) %% 1000) / 1000.0
FROM interactions WHERE status = 'ok' AND abs(hashtext('j' || request_id)) %% 10 < 3
"""


def prepare(admin_url: str, interactions: int, reuse: bool) -> str:
    url = scratch_database(admin_url, DB_NAME, reuse)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM experiments WHERE name = 'bench'").fetchone()
        if row is not None:
            n = conn.execute("SELECT count(*) FROM interactions").fetchone()
            if n is not None and n[0] == interactions:
                log(f"reusing {interactions:,} interactions in {DB_NAME}")
                return url
            raise SystemExit(f"{DB_NAME} holds other data; run without --reuse")
        up_id = conn.execute(
            "INSERT INTO upstreams (name, base_url) VALUES ('sim', 'http://127.0.0.1:8001') RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
        eid = conn.execute(
            "INSERT INTO experiments (name, route, mode, status, salt, content_logging, started_at)"
            " VALUES ('bench', 'assistant', 'shadow', 'running', 's', 'full', %s) RETURNING id",
            (START,),
        ).fetchone()[0]  # type: ignore[index]
        for name, control in (("control", True), ("candidate", False)):
            conn.execute(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (%s, %s, %s, 'm', 50, %s)",
                (eid, name, up_id, control),
            )
        started = time.perf_counter()
        for lo in range(0, interactions, CHUNK):
            hi = min(interactions, lo + CHUNK)
            conn.execute(INTERACTIONS_SQL, {"eid": eid, "lo": lo, "hi": hi, "start": START,
                                            "step": SPAN_S / interactions})  # fmt: skip
            log(f"interactions {hi:,} ({time.perf_counter() - started:.0f} s, indexes included)")
        conn.execute(FEEDBACK_SQL, {})
        conn.execute(JUDGEMENTS_SQL, {})
        conn.execute("VACUUM ANALYZE interactions")
        conn.execute("VACUUM ANALYZE feedback")
        conn.execute("VACUUM ANALYZE judgements")
        log(f"data ready in {time.perf_counter() - started:.0f} s")
    return url


def _timed(run: Callable[[], Any], repeats: int) -> dict[str, Any]:
    times: list[float] = []
    out: Any = None
    load = os.getloadavg()[0]
    for _ in range(repeats):
        t = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t)
    items = out.get("items", out.get("pairs", [])) if isinstance(out, dict) else []
    return {"median_ms": round(statistics.median(times) * 1000, 2), "min_ms": round(min(times) * 1000, 2),
            "max_ms": round(max(times) * 1000, 2), "runs": repeats, "rows": len(items),
            "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}  # fmt: skip


def measure(url: str, repeats: int) -> dict[str, Any]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    results: dict[str, Any] = {}
    with engine.connect() as conn:
        eid = int(conn.execute(text("SELECT id FROM experiments WHERE name = 'bench'")).scalar_one())
        results["rows"] = {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in ("interactions", "feedback", "judgements")
        }
        last_day = START + timedelta(seconds=SPAN_S - 86400)

        def deep(conn: Connection, pages: int) -> dict[str, Any]:
            doc = examples(conn, eid, ExampleFilter(variant="candidate"))
            for _ in range(pages - 1):
                doc = examples(conn, eid, ExampleFilter(variant="candidate"), cursor=doc["next_cursor"])
            return doc

        cases: dict[str, Callable[[], Any]] = {
            "first page, candidate (10% + shadow calls)": lambda: examples(conn, eid, ExampleFilter(variant="candidate")),
            "first page, control (85%)": lambda: examples(conn, eid, ExampleFilter(variant="control")),
            "first page, both variants merged": lambda: examples(conn, eid, ExampleFilter()),
            "page 10 through cursors (10 calls)": lambda: deep(conn, 10),
            "limit 100, candidate": lambda: examples(conn, eid, ExampleFilter(variant="candidate"), limit=100),
            "feedback thumbs_down, candidate": lambda: examples(conn, eid, ExampleFilter(variant="candidate", feedback="thumbs_down")),
            "metric thumbs_down_rate, both variants": lambda: examples(conn, eid, ExampleFilter(), metric="thumbs_down_rate"),
            "judge score 0.9-1.0, candidate": lambda: examples(conn, eid, ExampleFilter(variant="candidate", score_min=0.9)),
            "failed calls, candidate": lambda: examples(conn, eid, ExampleFilter(variant="candidate", error=True)),
            "category + segment, control": lambda: examples(conn, eid, ExampleFilter(variant="control", category="math", segment="task=code")),
            "last day of 30 (time window), candidate": lambda: examples(conn, eid, ExampleFilter(variant="candidate", since=last_day)),
            "no request matches (absent category), candidate: whole range walked": lambda: examples(conn, eid, ExampleFilter(variant="candidate", category="absent")),
            "shadow pairs, first page": lambda: shadow_pairs(conn, eid, ExampleFilter()),
            "shadow pairs, shadow judged ≤ 0.1": lambda: shadow_pairs(conn, eid, ExampleFilter(score_max=0.1)),
        }  # fmt: skip
        for label, run in cases.items():
            results[label] = _timed(run, repeats)
            log(f"{label}: {results[label]}")
        # Side by side: the first page without the examples index.
        conn.execute(text("SET enable_indexscan = off"))
        conn.execute(text("SET enable_indexonlyscan = off"))
        label = "first page, candidate, WITHOUT the examples index"
        results[label] = _timed(
            lambda: examples(conn, eid, ExampleFilter(variant="candidate")), max(3, repeats // 3)
        )
        log(f"{label}: {results[label]}")
        conn.rollback()
    engine.dispose()
    return results


def ingest_cost(url: str, rows: int, runs: int) -> dict[str, Any]:
    """What the examples index adds to writing interactions: the same rows inserted into two
    copies of the table, with every index of ``interactions`` and without the examples one,
    alternating, median of ``runs`` each."""
    out: dict[str, list[float]] = {"with the examples index": [], "without it": []}
    with psycopg.connect(url, autocommit=True) as conn:
        for t in ("lg_bench_with", "lg_bench_without"):
            conn.execute(f"DROP TABLE IF EXISTS {t}")
            conn.execute(f"CREATE UNLOGGED TABLE {t} (LIKE interactions INCLUDING ALL)")
        name = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'lg_bench_without'"
            " AND indexdef LIKE '%%hashtextextended%%'"
        ).fetchone()
        assert name is not None
        conn.execute(f'DROP INDEX "{name[0]}"')
        for _ in range(runs):
            for label, t in (
                ("with the examples index", "lg_bench_with"),
                ("without it", "lg_bench_without"),
            ):
                conn.execute(f"TRUNCATE {t}")
                started = time.perf_counter()
                conn.execute(f"INSERT INTO {t} SELECT * FROM interactions ORDER BY ts LIMIT %s", (rows,))
                out[label].append(time.perf_counter() - started)
        for t in ("lg_bench_with", "lg_bench_without"):
            conn.execute(f"DROP TABLE {t}")
    result: dict[str, Any] = {k: round(statistics.median(v), 3) for k, v in out.items()}
    result["rows"] = rows
    result["ratio"] = round(result["with the examples index"] / result["without it"], 3)
    result["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--interactions", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--ingest-rows", type=int, default=200_000, help="rows for the insert-cost comparison (0: skip)"
    )
    ap.add_argument("--reuse", action="store_true", help="keep an existing benchmark database")
    ap.add_argument("--drop", action="store_true", help="drop the benchmark database afterwards")
    args = ap.parse_args()
    url = prepare(args.admin_url, args.interactions, args.reuse)
    results = measure(url, args.repeats)
    if args.ingest_rows:
        results["insert cost, seconds"] = ingest_cost(url, args.ingest_rows, 3)
        log(f"insert cost: {results['insert cost, seconds']}")
    results["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    if args.drop:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
