"""Where the database time of one ingest batch goes, statement by statement.

No Kafka: N interaction events (the same generator as ``bench_ingest.py``), decoded
already, are written in batches through ``analytics.ingest.write.ingest_raw`` (what the
consumer calls: the COPY fast path, late feedback attribution, one transaction each) on
one connection, and the wall time of every statement and COPY is
summed per event. The client waits on each statement, so a statement's time is the
server's work (plus, for a COPY, the client's row formatting, which overlaps it). Then a
plain COPY of the same rows, for scale.

    .venv/bin/python bench/ingest/bench_write_path.py --events 200000 --runs 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import (
    TABLES,
    add_write_args,
    copy_rows,
    copy_run,
    make_events,
    scratch_database,
    truncate,
    write_pass,
)

TIMES: collections.defaultdict[str, float] = collections.defaultdict(float)


def _label(query: Any) -> str:
    """The statement's start, led by the table its last INSERT writes (two statements that
    begin alike, the histogram and sample folds, stay apart)."""
    text = " ".join((query.decode() if isinstance(query, bytes) else str(query)).split())
    target = text.rsplit("INSERT INTO ", 1)[1].split(" ", 1)[0] if "INSERT INTO " in text else ""
    return f"{target + ': ' if target else ''}{text[:50]}"


def _instrument() -> None:
    execute, copy = psycopg.Cursor.execute, psycopg.Cursor.copy

    def timed_execute(self: psycopg.Cursor[Any], query: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return execute(self, query, *a, **k)
        finally:
            TIMES[_label(query)] += time.perf_counter() - t

    @contextlib.contextmanager
    def timed_copy(self: psycopg.Cursor[Any], query: Any, *a: Any, **k: Any) -> Iterator[Any]:
        t = time.perf_counter()
        with copy(self, query, *a, **k) as cp:
            yield cp
        TIMES[_label(query)] += time.perf_counter() - t

    psycopg.Cursor.execute = timed_execute  # type: ignore[method-assign]
    psycopg.Cursor.copy = timed_copy  # type: ignore[method-assign,assignment]


def run(url: str, events: list[Any], batch: int) -> None:
    TIMES.clear()
    n = len(events)
    with psycopg.connect(url) as pg:
        total = write_pass(pg, events, batch, TABLES)
    print(f"write path: {total / n * 1e6:.1f} µs per event ({n / total:,.0f} ev/s on one connection)")
    for label, secs in sorted(TIMES.items(), key=lambda kv: -kv[1]):
        if secs / n * 1e6 >= 0.05:
            print(f"  {secs / n * 1e6:6.1f} µs  {label}")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    args = ap.parse_args()
    with scratch_database(args.admin_url, "lg_bench_write") as url:
        events = make_events(args.events, args.units)
        data = copy_rows(events)
        _instrument()
        for _ in range(args.runs):
            run(url, events, args.batch)
        truncate(url)
        rate = copy_run(url, data, args.events, [])
        print(f"plain COPY: {1e6 / rate:.1f} µs per row")


if __name__ == "__main__":
    main()
