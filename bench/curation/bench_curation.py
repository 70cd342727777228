"""Benchmark curation: a dataset from 1M stored calls, export throughput, near-duplicate cost.

    .venv/bin/python bench/curation/bench_curation.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres

1. **load** — ``--calls`` primary calls of one experiment (content logging full; prompts of
   ~25 words, 4 categories, 5% asked twice verbatim, 5% reworded by one word) and feedback
   on ``--thumbs-down`` of them, written with COPY (not timed as curation);
2. **create** — ``datasets create`` from all of them: (a) ``--where feedback=thumbs_down``,
   (b) ``--sample 10000 --stratify category``, (c) unfiltered (every call: the worst case);
   wall time, calls read, items kept;
3. **export** — (a) as ``eval``; (b) as ``chat`` after a 20% holdout split (the holdout
   check reads every holdout signature and every exported item's first), items/s and MB/s;
4. **near-duplicates** — MinHash signatures and LSH lookups+inserts for 100,000 prompts,
   µs per item.

A scratch database (``liftgate_bench_curation``) is created, migrated and dropped
(``--keep`` keeps it, ``--reuse`` uses a kept one instead of loading again;
``--create-only`` runs the creations only, ``--repeat N`` times).

CPU per creation is reported twice: this process's (Python: reading rows, redaction,
hashing, MinHash, COPY encoding) and the PostgreSQL backends' serving the scratch database
(``/proc/<pid>/stat`` of each backend in ``pg_stat_activity``, before and after; the server
must run on this host). CPU time is what the code costs whatever the machine's load; wall
time adds the wait for a core.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from sqlalchemy import create_engine, insert

from contracts.tables import Experiment
from curation import minhash
from curation.builder import create_version
from curation.export import export
from curation.spec import CurationSpec
from curation.split import split
from curation.text import normalise
from liftgate import db as dbmod

DB = "liftgate_bench_curation"
CATEGORIES = ("code", "math", "writing", "chat")
VOCAB = [f"{a}{b}{c}" for a in "bcdfgklmnprstvz" for b in "aeiou" for c in ("n", "r", "s", "t", "x", "l")]


def prompts(n: int, rng: random.Random) -> list[str]:
    out: list[str] = []
    for i in range(n):
        r = rng.random()
        if out and r < 0.05:
            out.append(out[rng.randrange(len(out))])  # asked again verbatim
        elif out and r < 0.10:
            words = out[rng.randrange(len(out))].split()
            words[rng.randrange(len(words))] = rng.choice(VOCAB)  # reworded by one word
            out.append(" ".join(words))
        else:
            out.append(f"Q{i}: " + " ".join(rng.choices(VOCAB, k=25)))
    return out


def load(url: str, calls: int, thumbs_down: float, seed: int) -> str:
    rng = random.Random(seed)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(Experiment).values(
                name="bench", route="bench", mode="ab", salt="s", content_logging="full"
            )
        )
    engine.dispose()
    texts = prompts(calls, rng)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        with conn.cursor() as cur:
            cols = ("event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source, role, mode,"
                    " endpoint, model, upstream, status, http_status, latency_ms, response_chars, stream, fallback,"
                    " tags, prompt, response")  # fmt: skip
            fb_rows = []
            with cur.copy(f"COPY interactions ({cols}) FROM STDIN") as copy:
                for i, text_ in enumerate(texts):
                    rid = f"r{i}"
                    variant = "candidate" if i % 2 else "baseline"
                    answer = f"answer {i} " + " ".join(rng.choices(VOCAB, k=40))
                    ts = t0 + timedelta(seconds=i)
                    copy.write_row((str(uuid.uuid4()), ts, rid, "bench", 1, variant, f"u{i % 50_000}", "header",
                                    "primary", "ab", "chat", "m", "up", "ok", 200, 5.0, len(answer), False, False,
                                    f'{{"category": "{CATEGORIES[i % 4]}"}}', text_, answer))  # fmt: skip
                    if rng.random() < thumbs_down:
                        fb_rows.append(
                            (
                                str(uuid.uuid4()),
                                ts,
                                rid,
                                f"u{i % 50_000}",
                                "thumbs_down",
                                1.0,
                                1,
                                variant,
                                "{}",
                            )
                        )
            with cur.copy("COPY feedback (event_id, ts, request_id, unit_id, kind, value, experiment_id, variant, tags)"
                          " FROM STDIN") as copy:  # fmt: skip
                for row in fb_rows:
                    copy.write_row(row)
        conn.execute("ANALYZE interactions")
        conn.execute("ANALYZE feedback")
    return "bench"


def backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds (user + system) of every PostgreSQL backend serving the scratch database."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (DB,))]
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        except OSError:
            continue  # ended meanwhile, or not on this host
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--thumbs-down", type=float, default=0.10)
    ap.add_argument("--skip-unfiltered", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    ap.add_argument("--reuse", action="store_true", help="use a kept scratch database (no load)")
    ap.add_argument("--create-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--label", default="", help="printed with every creation line")
    ap.add_argument("--only", choices=("thumbs_down", "sample"), help="run one creation only")
    args = ap.parse_args()
    if not args.reuse:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{DB}"')
    url = args.admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + f"/{DB}"
    try:
        if not args.reuse:
            dbmod.upgrade(url)
            started = time.perf_counter()
            load(url, args.calls, args.thumbs_down, 1)
            print(f"load: {args.calls:,} calls in {time.perf_counter() - started:.1f} s (not curation)")
        exp = "bench"
        print(f"load average at start: {os.getloadavg()}")
        engine = create_engine(url)
        runs = [("thumbs_down", CurationSpec(experiment=exp, feedback=("thumbs_down",))),
                ("sample 10,000 stratified", CurationSpec(experiment=exp, sample=10_000, seed=1))]  # fmt: skip
        if not args.skip_unfiltered:
            runs.append(("unfiltered", CurationSpec(experiment=exp)))
        if args.only:
            runs = [r for r in runs if r[0].startswith(args.only)]
        tag = secrets.token_hex(3)
        for rep in range(args.repeat):
            for k, (label, spec) in enumerate(runs):
                server = backend_cpu(url)
                t, cpu = time.perf_counter(), time.process_time()
                info = create_version(
                    engine, f"bench-{k}" + (f"-{tag}-{rep}" if args.reuse or rep else ""), spec, "bench"
                )
                wall, py = time.perf_counter() - t, time.process_time() - cpu
                pg = sum(v - server.get(pid, 0.0) for pid, v in backend_cpu(url).items())
                s = info.stats
                print(f"{args.label} create {label}: {wall:.2f} s wall; CPU {py:.2f} s Python + {pg:.2f} s PostgreSQL"
                      f" = {py + pg:.2f} s; load {os.getloadavg()[0]:.1f}; matched {s['matched']:,}, kept"
                      f" {info.item_count:,} (exact dup {s['exact_duplicates']:,}, near dup {s['near_duplicates']:,});"
                      f" content hash {info.content_hash[:12]}", flush=True)  # fmt: skip
        if args.create_only:
            engine.dispose()
            return
        # eval: the thumbs-down set; chat: the sample after a 20% holdout split (its items
        # mostly have no negative feedback, so their logged answers are usable).
        split(engine, "bench-1", 0.2, 1, "bench")
        for name, fmt in (("bench-0", "eval"), ("bench-1", "chat")):
            buf = io.BytesIO()
            t = time.perf_counter()
            res = export(engine, name, fmt, buf, "bench")
            dt = time.perf_counter() - t
            print(f"export {fmt} ({res.split}): {res.items:,} lines, {len(buf.getvalue()) / 1e6:.1f} MB in {dt:.2f} s"
                  f" = {res.items / dt:,.0f} items/s, {len(buf.getvalue()) / 1e6 / dt:.1f} MB/s")  # fmt: skip
        engine.dispose()
        texts = [normalise(t) for t in prompts(100_000, random.Random(2))]
        t = time.perf_counter()
        sigs: list[minhash.Signature] = []
        for i in range(0, len(texts), 2000):
            sigs.extend(minhash.signatures(texts[i : i + 2000]))
        sig_s = time.perf_counter() - t
        index = minhash.LshIndex()
        t = time.perf_counter()
        dups = 0
        for start in range(0, len(sigs), 2000):  # as the builder does: band keys per batch
            part = sigs[start : start + 2000]
            for k, (sig, keys) in enumerate(zip(part, minhash.band_keys_many(part), strict=True)):
                dups += index.add_unless_near(str(start + k), sig, keys) is not None
        lsh_s = time.perf_counter() - t
        print(f"near-duplicates, 100,000 prompts (~{sum(map(len, texts)) / len(texts):.0f} chars): signatures"
              f" {sig_s / len(texts) * 1e6:.1f} µs/item, LSH lookup+insert {lsh_s / len(texts) * 1e6:.1f} µs/item;"
              f" {dups:,} near-duplicates found")  # fmt: skip
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        if not args.keep:
            with psycopg.connect(args.admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
