"""Helpers for the ingest/consumer/aggregate tests: events and rollups computed in Python."""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg

from analytics.ingest.rollups import ONCE_KINDS
from contracts.events import (
    FEEDBACK_KINDS,
    ROLLOUT_STAGE_TAG,
    Event,
    FeedbackEvent,
    InteractionEvent,
    JudgeEvent,
)
from contracts.tables import ROLLUP_MEASURES

if TYPE_CHECKING:
    from analytics.ingest.consumer import ConsumerSettings

R = TypeVar("R")


def pg_url(database_url: str) -> str:
    return database_url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextmanager
def connect(database_url: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    with psycopg.connect(pg_url(database_url)) as conn:
        yield conn


def new_experiment_id() -> int:
    return random.randint(1_000_000, 2_000_000_000)


#: The tag keys the ingest tests' events carry (declared_experiment rolls them all up).
TEST_TAG_KEYS: Final = ("task", "lang", "ta\\sk")


def declare(database_url: str, exp: int, keys: Sequence[str] = TEST_TAG_KEYS) -> int:
    """Give experiment ``exp`` a row declaring ``keys`` as its segment tags (ingest folds
    only declared keys, and ``rollout_stage``); returns ``exp``."""
    with connect(database_url) as conn:
        conn.execute(
            "INSERT INTO experiments (id, name, route, mode, salt, segment_tags) VALUES (%s, %s, %s, 'ab', 's', %s)"
            " ON CONFLICT (id) DO UPDATE SET segment_tags = EXCLUDED.segment_tags",
            (exp, f"exp-{exp}", f"route-{exp}", list(keys)),
        )
    return exp


def declared_experiment(database_url: str, keys: Sequence[str] = TEST_TAG_KEYS) -> int:
    """A new experiment id whose row declares ``keys`` as segment tags."""
    return declare(database_url, new_experiment_id(), keys)


def interaction(exp: int | None, variant: str | None, unit: str, **kw: Any) -> InteractionEvent:
    base: dict[str, Any] = {
        "request_id": "req-" + secrets.token_hex(8),
        "route": "assistant",
        "unit_id": unit,
        "unit_source": "header",
        "role": "primary",
        "mode": "ab" if exp is not None else "none",
        "endpoint": "chat",
        "model": "m",
        "upstream": "u",
        "status": "ok",
        "http_status": 200,
        "latency_ms": 100.0,
        "experiment_id": exp,
        "variant": variant,
        "ttft_ms": 20.0,
        "prompt_tokens": 10,
        "completion_tokens": 30,
        "response_chars": 120,
    }
    base.update(kw)
    return InteractionEvent(**base)


def feedback(of: InteractionEvent, kind: str, value: float = 1.0) -> FeedbackEvent:
    return FeedbackEvent(request_id=of.request_id, unit_id=of.unit_id, kind=kind, value=value)


def random_events(exp: int, n: int, rng: random.Random, *, units: int = 50) -> list[Event]:
    """Interactions over a few units and variants, with tags, errors and feedback."""
    out: list[Event] = []
    t0 = 1.7e9 + rng.random() * 1e6
    for i in range(n):
        unit = f"u{rng.randrange(units)}"
        variant = "control" if hash(unit) % 2 else "candidate"
        conv = f"c-{unit}-{rng.randrange(3)}" if rng.random() < 0.7 else None
        ev = interaction(
            exp,
            variant,
            unit,
            status="error" if rng.random() < 0.05 else "ok",
            latency_ms=rng.lognormvariate(5, 0.5),
            ttft_ms=rng.lognormvariate(3, 0.5) if rng.random() < 0.5 else None,
            completion_tokens=rng.randrange(1, 400),
            response_chars=rng.randrange(0, 2000),
            conversation_id=conv,
            fallback=rng.random() < 0.02,
            tags={"task": rng.choice(["code", "math", "chat"])},
            ts=t0 + i * 0.001,
        )
        out.append(ev)
        r = rng.random()
        if r < 0.3:
            out.append(
                feedback(ev, rng.choice(["thumbs_up", "thumbs_down", "copy", "regenerate", "continued"]))
            )
        elif r < 0.4:
            out.append(feedback(ev, "rating", float(rng.randrange(1, 6))))
        elif r < 0.45:
            out.append(feedback(ev, "my_signal", rng.random()))
    return out


_KIND_COLUMN = {
    "thumbs_up": "thumbs_up",
    "thumbs_down": "thumbs_down",
    "regenerate": "regenerates",
    "copy": "copies",
    "edit": "edits",
    "continued": "continued",
}


def expected_rollups(
    events: Iterable[Event], declared: Collection[str] | None = None
) -> dict[tuple[int, str, str, str], dict[str, Any]]:
    """(experiment, segment, variant, unit) -> measures, computed naively in Python.

    ``declared``: the tag keys rolled up per segment (with ``rollout_stage``); None: every tag."""
    keep = None if declared is None else {*declared, ROLLOUT_STAGE_TAG}
    evs = list(events)
    by_request = {e.request_id: e for e in evs if isinstance(e, InteractionEvent) and e.role == "primary"}
    out: dict[tuple[int, str, str, str], dict[str, Any]] = defaultdict(
        lambda: dict.fromkeys(ROLLUP_MEASURES, 0.0)
    )
    seen_conv: set[str] = set()
    counted_once: set[tuple[str, str]] = set()  # yes/no kinds: once per response, value > 0
    for e in evs:
        if isinstance(e, JudgeEvent):
            continue  # judge scores have their own table, no rollup
        if isinstance(e, FeedbackEvent) and e.kind in ONCE_KINDS:
            if (e.kind != "task_success" and e.value <= 0) or (e.request_id, e.kind) in counted_once:
                continue
            if e.request_id in by_request:
                counted_once.add((e.request_id, e.kind))
        if isinstance(e, InteractionEvent):
            if e.role != "primary" or e.experiment_id is None or e.variant is None:
                continue
            inter, segs = e, ["", *(f"{k}={v}" for k, v in e.tags.items() if keep is None or k in keep)]
        else:
            i = by_request.get(e.request_id)
            if i is None or i.experiment_id is None or i.variant is None:
                continue
            inter, segs = i, ["", *(f"{k}={v}" for k, v in i.tags.items() if keep is None or k in keep)]
        assert inter.experiment_id is not None and inter.variant is not None
        for seg in segs:
            key = (inter.experiment_id, seg, inter.variant, inter.unit_id)
            m = out[key]
            if isinstance(e, InteractionEvent):
                m["requests"] += 1
                m["turns"] += 1
                m["errors"] += e.status == "error"
                m["fallbacks"] += e.fallback
                m["latency_sum"] += e.latency_ms
                m["ttft_n"] += e.ttft_ms is not None
                m["ttft_sum"] += e.ttft_ms or 0.0
                m["prompt_tokens"] += e.prompt_tokens or 0
                m["completion_tokens"] += e.completion_tokens or 0
                m["response_chars"] += e.response_chars
                if e.conversation_id is None or e.conversation_id not in seen_conv:
                    m["conversations"] += 1
            elif e.kind in _KIND_COLUMN:
                m[_KIND_COLUMN[e.kind]] += 1
            elif e.kind == "rating":
                m["ratings_n"] += 1
                m["ratings_sum"] += e.value
            elif e.kind == "task_success":
                m["task_success_n"] += 1
                m["task_success_sum"] += e.value
            else:
                assert e.kind not in FEEDBACK_KINDS
                counters = m.setdefault("counters", {})
                counters[e.kind] = counters.get(e.kind, 0.0) + e.value
                counters[e.kind + ":n"] = counters.get(e.kind + ":n", 0) + 1
        if isinstance(e, InteractionEvent) and e.conversation_id is not None:
            seen_conv.add(e.conversation_id)
    return dict(out)


def stored_rollups(
    conn: psycopg.Connection[Any], exp: int
) -> dict[tuple[int, str, str, str], dict[str, Any]]:
    cols = ", ".join(ROLLUP_MEASURES)
    out: dict[tuple[int, str, str, str], dict[str, Any]] = {}
    for table, seg in (("unit_rollups", "''"), ("segment_rollups", "segment")):
        rows = conn.execute(
            f"SELECT experiment_id, {seg}, variant, unit_id, counters, {cols} FROM {table} WHERE experiment_id = %s".encode(),
            (exp,),
        ).fetchall()
        for row in rows:
            m: dict[str, Any] = dict(zip(ROLLUP_MEASURES, (float(x) for x in row[5:]), strict=True))
            if row[4]:
                m["counters"] = {k: float(v) for k, v in row[4].items()}
            out[(row[0], row[1], row[2], row[3])] = m
    return out


def assert_rollups_equal(got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]]) -> None:
    assert got.keys() == want.keys(), f"missing {set(want) - set(got)} extra {set(got) - set(want)}"
    for key, w in want.items():
        g = got[key]
        for col, wv in w.items():
            if col == "counters":
                assert g.get("counters", {}).keys() == wv.keys(), key
                for k, v in wv.items():
                    assert abs(g["counters"][k] - v) < 1e-6 * max(1.0, abs(v)), (key, k)
            else:
                assert abs(g[col] - wv) < 1e-6 * max(1.0, abs(wv)), (key, col, g[col], wv)


# --- Kafka ------------------------------------------------------------------------------------


def create_topics(bootstrap: str, *names: str, partitions: int = 6) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="lg-test-admin")
    try:
        admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names])
    finally:
        admin.close()
    # CreateTopics returns once the controller has the topics; the broker serves them in
    # Metadata a moment later. A consumer group that forms in between is assigned nothing
    # ("No partition metadata") until its next metadata refresh: wait until they are served.
    from kafka import KafkaConsumer

    probe = KafkaConsumer(bootstrap_servers=bootstrap, client_id="lg-test-probe")
    try:
        wait_for(
            lambda: all(len(probe.partitions_for_topic(n) or ()) == partitions for n in names),
            30,
            f"topics {names} in the broker's metadata",
        )
    finally:
        probe.close()


def committed_offsets(
    bootstrap: str, group: str, request_timeout_ms: int = 30_000
) -> dict[tuple[str, int], int]:
    """The group's committed offsets per (topic, partition), read by an admin client (raises
    ``KafkaError`` while no broker answers for the group, e.g. its coordinator still loading)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return {(tp.topic, tp.partition): int(m.offset) for tp, m in offsets.items()}


def produce(bootstrap: str, items: Iterable[tuple[str, bytes | None, bytes]]) -> None:
    """Send (topic, key, value) with a plain producer and wait until all are acknowledged."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for topic, key, value in items:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)


def event_records(
    events: Iterable[Event], interactions_topic: str, feedback_topic: str
) -> list[tuple[str, bytes | None, bytes]]:
    from contracts.events import encode

    return [
        (interactions_topic if isinstance(e, InteractionEvent) else feedback_topic, e.key, encode(e))
        for e in events
    ]


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll a real condition until it holds or the deadline passes."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def count_rows(database_url: str, sql: str, *params: object) -> int:
    with connect(database_url) as conn:
        row = conn.execute(sql.encode(), params).fetchone()
    return int(row[0]) if row else 0


def intrude_as_static_member(settings: ConsumerSettings, deadline_s: float = 30.0) -> None:
    """Join the consumer's group with its own ``group.instance.id`` until the broker hands
    this client the partitions (the consumer holding the id is fenced from then on), then
    leave without committing anything."""
    from analytics.ingest.consumer import consumer_options
    from eventbus import BusError, open_bus

    intruder = open_bus(settings.kafka_client).consumer(consumer_options(settings))
    try:
        intruder.subscribe([settings.interactions_topic, settings.feedback_topic, settings.judgements_topic])
        deadline = time.monotonic() + deadline_s
        while not intruder.assignment():
            assert time.monotonic() < deadline, "the intruder was never assigned the partitions"
            try:
                intruder.poll_batch(100, 0.1)  # records read here are never committed
            except BusError:
                return  # fenced back already by the consumer's new client
    finally:
        intruder.close()


def while_waiting_commit(a: psycopg.Connection[tuple[Any, ...]], run: Callable[[], R]) -> R:
    """Run ``run`` (a batch on another connection) in a thread while ``a``'s transaction is
    open; once a backend waits on a lock (the batch, on one of a's rows), commit ``a``; the
    batch's result."""
    result: list[R] = []
    t = threading.Thread(target=lambda: result.append(run()))
    t.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not waiting_on_a_lock(a):
        time.sleep(0.01)
    a.commit()
    t.join(timeout=30)
    assert not t.is_alive() and len(result) == 1
    return result[0]


def waiting_on_a_lock(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Whether a backend of ``conn``'s database waits on a lock."""
    row = conn.execute(
        b"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row and row[0])
