"""Kafka → Postgres ingest throughput vs a plain COPY of the same rows (same run).

1. Creates a scratch database (migrated) and a topic with 6 partitions; produces N
   interaction events (realistic fields: 2 variants, tags, conversations) once.
2. Consumer runs: truncate the event/rollup tables, start ``analytics.ingest.consumer`` (the
   real consumer: decode, COPY staging, ON CONFLICT insert, rollups, offset commits) in
   a thread with a fresh group id, and time from its first committed batch until all N
   are committed and a CHECKPOINT has written back the pages they dirtied. Rate = events
   after the first batch / elapsed. With several consumer processes it also prints the
   **sustained** rate: the sum of each process's own rate, from its first commit once the group
   has formed (every process owns its partitions) to its last, each charged its share of the
   final CHECKPOINT. The processes join the group one after the other: the first can own
   every partition for a batch or two while the second waits out that rebalance
   (bench/ingest/README.md, 2026-12-05); the whole-run rate counts that start-up, which a
   running group does not see again, and the sustained rate does not.
3. COPY runs: truncate, then COPY the same rows (pre-rendered text) straight into
   ``interactions`` (same indexes), then a CHECKPOINT: the database's raw ingest ceiling.
   Every phase starts after a CHECKPOINT (untimed) and ends with one (timed), so no phase
   pays for another's writes whatever the server's shared_buffers.

Prints medians over --runs; the figures go to bench/ingest/README.md.

    .venv/bin/python bench/ingest/bench_ingest.py --events 300000 --runs 3
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from analytics.ingest import copy_text
from analytics.ingest.consumer import ConsumerMetrics, ConsumerSettings, run_consumer
from analytics.ingest.rollups import compact_all_rl_rollups
from contracts.events import InteractionEvent, encode
from liftgate import db as dbmod

ADMIN_URL = "postgresql://postgres@127.0.0.1:15432/postgres"  # the embedded server (scripts/pg up)


def add_write_args(ap: argparse.ArgumentParser) -> None:
    """The options of the write-path benches (no Kafka): server, events, units, batch, runs."""
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--units", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2)


@contextmanager
def scratch_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A freshly migrated database on the server of ``admin_url`` (its URL), dropped on exit."""
    name = f"{prefix}_{secrets.token_hex(3)}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        url = f"{admin_url.rsplit('/', 1)[0]}/{name}"
        dbmod.upgrade(url.replace("postgresql://", "postgresql+psycopg://", 1))
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


#: Every table the ingest write path writes: each run starts from empty ones. (Leaving some
#: out made every run after the first fold into the previous run's rows — updates, not
#: inserts — and read 2.4x slower than the first.)
TABLES = (
    "interactions, feedback, feedback_counted, conversations_counted, judgements, response_ngrams, "
    "unit_rollups, segment_rollups, rl_rollups, preperiod_rollups, latency_histograms, latency_samples, "
    "dead_letters"
)


def make_events(n: int, units: int, seed: int = 1) -> list[InteractionEvent]:
    rng = random.Random(seed)
    t0 = time.time() - 3600
    out = []
    for i in range(n):
        u = rng.randrange(units)
        out.append(
            InteractionEvent(
                request_id=secrets.token_hex(12),
                route="assistant",
                unit_id=f"user-{u}",
                unit_source="header",
                role="primary",
                mode="ab",
                endpoint="chat",
                model="cand" if u % 2 else "base",
                upstream="sim",
                status="error" if rng.random() < 0.02 else "ok",
                http_status=200,
                latency_ms=rng.lognormvariate(6, 0.5),
                experiment_id=1,
                experiment="bench",
                variant="candidate" if u % 2 else "control",
                ttft_ms=rng.lognormvariate(4, 0.5),
                prompt_tokens=rng.randrange(10, 500),
                completion_tokens=rng.randrange(10, 800),
                response_chars=rng.randrange(50, 3000),
                finish_reason="stop",
                stream=True,
                conversation_id=f"conv-{u}-{rng.randrange(5)}" if rng.random() < 0.7 else None,
                tags={"task": rng.choice(("code", "math", "chat"))},
                ts=t0 + i * 0.01,
            )
        )
    # The gateway's task category (the RL-risk rollup's key), from the task tag as the
    # gateway assigns it: set afterwards so the draws above stay the same.
    return [dataclasses.replace(e, category=e.tags["task"]) for e in out]


def write_pass(pg: psycopg.Connection[Any], events: list[InteractionEvent], batch: int, tables: str) -> float:
    """Truncate ``tables``, then write ``events`` through the consumer's write path
    (``analytics.ingest.write.ingest_raw``) in batches of ``batch`` on ``pg``, with the sample
    cuts and counted conversations it learns kept across batches as a consumer keeps them:
    the seconds taken."""
    from analytics.ingest import copy_text, samples, write

    pg.execute(f"TRUNCATE {tables}".encode())
    pg.commit()
    cuts = samples.SampleCuts()  # the truncated tables' cuts and conversations are not known
    conversations = copy_text.CountedConversations()
    raws = [write.Raw(encode(e), "bench", 0, i, e.key, e) for i, e in enumerate(events)]
    t0 = time.perf_counter()
    for i in range(0, len(events), batch):
        write.ingest_raw(pg, raws[i : i + batch], (), cuts=cuts, conversations=conversations)
    return time.perf_counter() - t0


def _component(p: psutil.Process, consumers: set[int]) -> str | None:
    try:
        if p.pid in consumers:
            return "consumer"
        name = p.name()
        if name.startswith("postgres"):
            return "postgres"
        if name == "java" and any("kafka" in a for a in p.cmdline()):
            return "broker"
    except psutil.Error:
        return None
    return None


def checkpoint(db_url: str) -> None:
    """Write every dirty page back (PostgreSQL's CHECKPOINT). Each timed phase ends with one,
    inside its window: a phase pays for the pages it dirtied even when shared_buffers is large
    enough to hold them past its end (the checkpointer would otherwise write them during the
    next phase, charged to it)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(b"CHECKPOINT")


def cpu_seconds(consumers: set[int]) -> dict[str, float]:
    """CPU time (user + system) so far of Postgres, the broker and the consumer processes."""
    out: dict[str, float] = {}
    for p in psutil.process_iter():
        k = _component(p, consumers)
        if k:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            out[k] = out.get(k, 0.0) + t.user + t.system
    return out


def cpu_per_event(before: dict[str, float], after: dict[str, float], events: float) -> dict[str, float]:
    """µs of CPU per event by component over a measured window."""
    if events <= 0:
        raise RuntimeError("no event after the first batch: use more --events than one batch (20,000)")
    return {k: (after.get(k, 0.0) - before.get(k, 0.0)) / events * 1e6 for k in sorted(after)}


def produce(bootstrap: str, topic: str, events: list[InteractionEvent]) -> float:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=512 * 1024, max_request_size=8 << 20
    )
    t = time.perf_counter()
    for e in events:
        producer.send(topic, key=e.key, value=encode(e))
    producer.flush(timeout=300)
    producer.close()
    return time.perf_counter() - t


def check_rollups(db_url: str, events: list[InteractionEvent]) -> None:
    """Every counted event is in the rollups exactly once (a wrong figure is no figure)."""
    want = sum(1 for e in events if e.role == "primary" and e.experiment_id is not None)
    with psycopg.connect(db_url) as conn:
        row = conn.execute(b"SELECT coalesce(sum(requests), 0) FROM unit_rollups").fetchone()
    if row is None or int(row[0]) != want:
        raise RuntimeError(f"rollups count {row} requests, expected {want}")


def consumer_run(
    db_url: str,
    bootstrap: str,
    topic: str,
    n: int,
    timeout: float,
    cpu: list[dict[str, float]],
    threads: int = 1,
) -> float:
    metrics = ConsumerMetrics(CollectorRegistry())
    settings = ConsumerSettings(
        database_url=db_url,
        kafka_bootstrap=bootstrap,
        consumer_group=f"bench-{secrets.token_hex(4)}",
        interactions_topic=topic,
        feedback_topic=topic + "-fb",
        judgements_topic=topic + "-judge",
        consumer_poll_ms=200,
        consumer_threads=threads,
    )
    stop = threading.Event()
    th = threading.Thread(target=run_consumer, args=(settings, stop, metrics), daemon=True)
    th.start()

    def consumed() -> float:
        return (
            metrics.registry.get_sample_value("liftgate_analytics_events_consumed_total", {"topic": topic})
            or 0.0
        )

    deadline = time.monotonic() + timeout
    first_n, first_t = 0.0, 0.0
    me = {os.getpid()}
    cpu0: dict[str, float] = {}
    while time.monotonic() < deadline:
        c = consumed()
        if c and not first_t:
            first_n, first_t = c, time.perf_counter()
            cpu0 = cpu_seconds(me)
        if c >= n:
            break
        time.sleep(0.01)
    checkpoint(db_url)
    end = time.perf_counter()
    cpu.append(cpu_per_event(cpu0, cpu_seconds(me), n - first_n))
    stop.set()
    th.join(timeout=60)
    if consumed() < n:
        raise RuntimeError(f"consumer did not finish: {consumed()} of {n}")
    write_s = metrics.registry.get_sample_value("liftgate_analytics_batch_write_seconds_sum") or 0.0
    batches = metrics.registry.get_sample_value("liftgate_analytics_batch_write_seconds_count") or 0.0
    print(f"  consumer: {batches:.0f} batches, {write_s:.1f}s in DB writes, {end - first_t:.1f}s elapsed")
    return (n - first_n) / (end - first_t)


def committed_by_partition(admin: KafkaAdminClient, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets in ``topic``, per partition (the bench's events are all there)."""
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    except Exception:  # the group does not exist before its first commit
        return {}
    return {tp.partition: max(0, int(m.offset)) for tp, m in offsets.items() if tp.topic == topic}


def formed_group(
    admin: KafkaAdminClient, group: str, topic: str, members: int
) -> list[frozenset[int]] | None:
    """Each member's partitions of ``topic`` once the group is stable with ``members`` members
    that each own some; None before."""
    try:
        info = admin.describe_groups([group]).get(group) or {}
    except Exception:  # not formed yet
        return None
    if info.get("group_state") != "Stable" or len(info.get("members") or ()) != members:
        return None
    owners = []
    for m in info["members"]:
        assignment = m.get("member_assignment") or {}
        owned = frozenset(
            p
            for a in assignment.get("assigned_partitions") or ()
            if a.get("topic") == topic
            for p in a.get("partitions") or ()
        )
        if not owned:
            return None
        owners.append(owned)
    return owners


def sustained_rate(
    timeline: list[tuple[float, dict[int, int]]],
    owners: list[frozenset[int]],
    formed_t: float,
    checkpoint_s: float,
) -> float:
    """The sum of each member's rate over its own commits from its first one after ``formed_t``
    to its last; the members' windows share the final CHECKPOINT's ``checkpoint_s`` in
    proportion to their events (the module's docstring)."""
    windows = []
    for owned in owners:
        commits: list[tuple[float, int]] = []  # (time, the member's committed events) at each change
        seen = 0
        for t, parts in timeline:
            total = sum(parts.get(p, 0) for p in owned)
            if total != seen:  # a look that saw nothing new is no commit
                commits.append((t, total))
                seen = total
        after = [(t, v) for t, v in commits if t > formed_t]
        if len(after) < 2:
            raise RuntimeError(
                f"a member committed {len(after)} batches after the group formed: use more --events"
            )
        windows.append((after[-1][1] - after[0][1], after[-1][0] - after[0][0]))
    events = sum(e for e, _ in windows)
    return sum(e / (s + checkpoint_s * e / events) for e, s in windows)


def consumer_processes_run(
    db_url: str,
    bootstrap: str,
    topic: str,
    n: int,
    timeout: float,
    procs: int,
    cpu: list[dict[str, float]],
    naive: bool = False,
    log_dir: str | None = None,
    sustained: list[float] | None = None,
) -> float:
    """``procs`` consumer processes in one group (each has its own GIL); progress = committed offsets.

    ``naive``: ``naive_consumer.py`` (Kafka → COPY, no guarantees, no rollups) instead of the
    real consumer. ``sustained``: gets the run's sustained rate (the module's docstring).
    """
    group = f"bench-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "LIFTGATE_DATABASE_URL": db_url.replace("postgresql://", "postgresql+psycopg://", 1),
        "LIFTGATE_KAFKA_BOOTSTRAP": bootstrap,
        "LIFTGATE_CONSUMER_GROUP": group,
        "LIFTGATE_INTERACTIONS_TOPIC": topic,
        "LIFTGATE_FEEDBACK_TOPIC": topic + "-fb",
        # Its own (empty) judgements topic: the default one may hold a gateway's judge events
        # on a shared broker, which the bench's new group would read from the start.
        "LIFTGATE_JUDGEMENTS_TOPIC": topic + "-judge",
    }
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(Path(__file__).with_name("naive_consumer.py"))] if naive else [
        sys.executable, "-m", "analytics.ingest.consumer"
    ]  # fmt: skip
    logs = [
        open(os.path.join(log_dir, f"{'naive' if naive else 'consumer'}-{group}-{i}.log"), "wb")  # noqa: SIM115
        if log_dir
        else None
        for i in range(procs)
    ]
    ps = [subprocess.Popen(cmd, cwd=root, env=env, stderr=f if f else subprocess.DEVNULL) for f in logs]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    pids = {p.pid for p in ps}
    try:
        deadline = time.monotonic() + timeout
        first_n, first_t, c = 0, 0.0, 0
        cpu0: dict[str, float] = {}
        owners: list[frozenset[int]] | None = None  # each member's partitions, once the group formed
        formed_t = 0.0
        timeline: list[tuple[float, dict[int, int]]] = []  # (time, committed offset per partition)
        while time.monotonic() < deadline:
            parts = committed_by_partition(admin, group, topic)
            c = sum(parts.values())
            now = time.perf_counter()
            if c and not first_t:
                first_n, first_t = c, now
                cpu0 = cpu_seconds(pids)
            if owners is None:
                owners = formed_group(admin, group, topic, procs)
                formed_t = now
            timeline.append((now, parts))
            if c >= n:
                break
            time.sleep(0.1)  # an admin request per look: poll gently (bounds the error to 0.1 s)
        if c < n:
            raise RuntimeError(f"consumers did not finish: {c} of {n}")
        last = time.perf_counter()
        checkpoint(db_url)
        end = time.perf_counter()
        cpu.append(cpu_per_event(cpu0, cpu_seconds(pids), n - first_n))
        if sustained is not None and owners is not None:
            sustained.append(sustained_rate(timeline, owners, formed_t, end - last))
        print(
            f"  {procs} {'naive ' if naive else ''}consumer processes: {end - first_t:.1f}s elapsed,"
            f" peak RSS {max(peak_rss_mib(p) for p in pids):.0f} MiB"
        )
        return (n - first_n) / (end - first_t)
    finally:
        for p in ps:
            p.send_signal(signal.SIGTERM)
        for p in ps:
            p.wait(timeout=60)
        for f in logs:
            if f:
                f.close()
        admin.close()


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory so far (Linux VmHWM), MiB; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def copy_rows(events: list[InteractionEvent]) -> bytes:
    """The same rows as COPY text for the interactions table."""
    buf = io.StringIO()

    def f(v: object) -> str:
        if v is None:
            return "\\N"
        if isinstance(v, bool):
            return "t" if v else "f"
        return str(v).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")

    for e in events:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.ts)) + f".{int(e.ts % 1 * 1e6):06d}+00"
        row = copy_text.interaction_row(e, ts)  # the one column list
        buf.write("\t".join(f(v) for v in row) + "\n")
    return buf.getvalue().encode()


def binary_copy_rows(events: list[InteractionEvent]) -> bytes:
    """The same rows in COPY's binary format (signature, the C renderer's tuples, trailer)."""
    parts = [copy_text.BINARY_HEADER]
    for i in range(0, len(events), 10_000):
        parts.append(copy_text.render_c(events[i : i + 10_000], set(), set())[0])
    parts.append(copy_text.BINARY_TRAILER)
    return b"".join(parts)


def copy_run(db_url: str, data: bytes, n: int, cpu: list[dict[str, float]], binary: bool = False) -> float:
    """A plain COPY of ``data`` (COPY text, or binary format when ``binary``) into interactions."""
    statement = f"COPY interactions ({copy_text.INTERACTION_COLUMNS}) FROM STDIN"
    if binary:
        statement += " (FORMAT binary)"
    with psycopg.connect(db_url) as conn:
        cpu0 = cpu_seconds(set())
        t = time.perf_counter()
        with conn.cursor() as cur, cur.copy(statement.encode()) as cp:
            for i in range(0, len(data), 1 << 20):
                cp.write(data[i : i + (1 << 20)])
        conn.commit()
        checkpoint(db_url)
        rate = n / (time.perf_counter() - t)
        cpu.append(cpu_per_event(cpu0, cpu_seconds(set()), n))
        return rate


def declare_segments(db_url: str, keys: list[str]) -> None:
    """The bench experiment (id 1, the events' ``experiment_id``) and its declared segment keys."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            b"INSERT INTO experiments (id, name, route, mode, salt, segment_tags) VALUES (1, 'bench', 'bench', 'ab', 's', %s)",
            (keys,),
        )


@contextmanager
def compacting(db_url: str, interval: float) -> Iterator[dict[str, int]]:
    """``compact_all_rl_rollups`` every ``interval`` s in a thread while the block runs (what the
    analytics service's rl-compaction worker does beside ingest; 0: not at all). Its database
    time is the PostgreSQL CPU the run measures. Yields {"rows": moved so far, "runs": …}."""
    done = {"rows": 0, "runs": 0}
    if interval <= 0:
        yield done
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            with psycopg.connect(db_url) as pg:
                done["rows"] += compact_all_rl_rollups(pg, deadline=time.monotonic() + interval)
            done["runs"] += 1

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield done
    finally:
        stop.set()
        th.join(timeout=600)


def truncate(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES}".encode())
    checkpoint(db_url)  # untimed: the next phase starts with nothing left to write back


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--units", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=1, help="> 1: that many consumer processes in one group")
    ap.add_argument("--threads", type=int, default=1, help="group members in the one in-process consumer")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument(
        "--naive", action="store_true", help="also time naive Kafka -> COPY consumers (naive_consumer.py)"
    )
    ap.add_argument(
        "--binary-copy",
        action="store_true",
        help="also time a plain COPY of the same rows in binary format (the format the consumer writes)",
    )
    ap.add_argument("--logs", default=None, help="directory for the consumer processes' logs (stderr)")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (GIL handoff)")
    ap.add_argument(
        "--compact-interval",
        type=float,
        default=0.0,
        help="compact rl_rollups every this many s during the ingest runs, as the analytics service does (0: never)",
    )
    ap.add_argument(
        "--segment-tags",
        default="task",
        help="tag keys the bench experiment declares for segments, comma-separated ('' for none);"
        " the default declares the events' one tag: the segment work every event cost before declarations",
    )
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    topic = f"bench-ingest-{secrets.token_hex(3)}"
    with scratch_database(args.admin_url, "lg_bench_ingest") as db_url:
        declare_segments(db_url, [k for k in args.segment_tags.split(",") if k])
        admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
        try:
            admin.create_topics([NewTopic(t, 6, 1) for t in (topic, topic + "-fb", topic + "-judge")])
            events = make_events(args.events, args.units)
            print(f"produced {args.events:,} events in {produce(args.bootstrap, topic, events):.1f}s")
            data = copy_rows(events)
            binary = binary_copy_rows(events) if args.binary_copy else b""
            binary_rates: list[float] = []
            kafka_rates, copy_rates = [], []
            sustained: list[float] = []
            kafka_cpu: list[dict[str, float]] = []
            copy_cpu: list[dict[str, float]] = []
            naive_rates: list[float] = []
            naive_cpu: list[dict[str, float]] = []
            for run in range(args.runs):
                truncate(db_url)
                with compacting(db_url, args.compact_interval) as compacted:
                    if args.consumers > 1:
                        rate = consumer_processes_run(
                            db_url, args.bootstrap, topic, args.events, args.timeout, args.consumers, kafka_cpu,
                            log_dir=args.logs, sustained=sustained,
                        )  # fmt: skip
                    else:
                        rate = consumer_run(
                            db_url, args.bootstrap, topic, args.events, args.timeout, kafka_cpu, args.threads
                        )
                if args.compact_interval > 0:
                    print(f"  rl_rollups compaction: {compacted['rows']:,} rows in {compacted['runs']} runs")
                check_rollups(db_url, events)
                kafka_rates.append(rate)
                truncate(db_url)
                copy_rates.append(copy_run(db_url, data, args.events, copy_cpu))
                extra = ""  # what the run's line adds after the COPY rate
                if args.binary_copy:
                    truncate(db_url)
                    binary_rates.append(copy_run(db_url, binary, args.events, [], binary=True))
                    extra = f", binary COPY {binary_rates[-1]:,.0f} rows/s ({kafka_rates[-1] / binary_rates[-1]:.2f}x)"
                if args.naive:
                    truncate(db_url)
                    naive_rates.append(
                        consumer_processes_run(
                            db_url, args.bootstrap, topic, args.events, args.timeout, max(1, args.consumers),
                            naive_cpu, naive=True, log_dir=args.logs,
                        )
                    )  # fmt: skip
                    extra = f", naive kafka->COPY {naive_rates[-1]:,.0f} ev/s"
                if len(sustained) == run + 1:
                    extra += (
                        f"; sustained {sustained[-1]:,.0f} ev/s = {sustained[-1] / copy_rates[-1]:.2f}x COPY"
                    )
                    if args.binary_copy:
                        extra += f" ({sustained[-1] / binary_rates[-1]:.2f}x binary COPY)"
                print(
                    f"run {run + 1}: kafka->postgres {kafka_rates[-1]:,.0f} ev/s, plain COPY {copy_rates[-1]:,.0f} rows/s"
                    f" = {kafka_rates[-1] / copy_rates[-1]:.2f}x{extra} (load {os.getloadavg()[0]:.1f})"
                )
            k_med, c_med = statistics.median(kafka_rates), statistics.median(copy_rates)
            print(
                f"median: kafka->postgres {k_med:,.0f} ev/s; plain COPY {c_med:,.0f} rows/s; ratio {k_med / c_med:.2f}"
            )
            per_run = sorted(k / c for k, c in zip(kafka_rates, copy_rates, strict=True))
            print(
                f"ratio per run (each against the COPY of the same run): median {statistics.median(per_run):.2f},"
                f" range {per_run[0]:.2f}-{per_run[-1]:.2f}"
            )

            if sustained and len(sustained) == len(copy_rates):
                per_run = sorted(r / c for r, c in zip(sustained, copy_rates, strict=True))
                print(
                    f"sustained (the formed group): median {statistics.median(sustained):,.0f} ev/s;"
                    f" ratio per run median {statistics.median(per_run):.2f}, range {per_run[0]:.2f}-{per_run[-1]:.2f}"
                )

            def cpu_line(runs: list[dict[str, float]]) -> str:
                keys = sorted({k for r in runs for k in r})
                med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
                parts = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
                return f"{parts}; total {sum(med.values()):.1f}"

            print(f"CPU µs per event (medians), kafka->postgres: {cpu_line(kafka_cpu)}")
            print(f"CPU µs per row (medians), plain COPY: {cpu_line(copy_cpu)}")
            if naive_rates:
                n_med = statistics.median(naive_rates)
                print(
                    f"naive kafka->COPY median {n_med:,.0f} ev/s; kafka->postgres / naive {k_med / n_med:.2f}"
                )
                print(f"CPU µs per event (medians), naive kafka->COPY: {cpu_line(naive_cpu)}")
        finally:
            try:
                admin.delete_topics([topic, topic + "-fb", topic + "-judge"])
            finally:
                admin.close()


if __name__ == "__main__":
    main()
