"""Content logging ``hashed`` end to end: the reward-hacking scenario's simulator behind the real
gateway (n-gram sampler on, judge sampler on, feedback through /v1/feedback) delivering through
the real Direct sink into PostgreSQL; the same events through a real Kafka broker and the
consumer into a second experiment; the analytics service as a real process. The stuffed
phrase's hash is flagged on both paths and resolved to text only by the operator's phrase;
no response text reaches an event or a table."""

from __future__ import annotations

import asyncio
import random
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from analytics.ingest.consumer import ConsumerMetrics, ConsumerSettings, run_consumer
from contracts.events import (
    Event,
    FeedbackEvent,
    InteractionEvent,
    JudgeEvent,
    NgramsEvent,
    encode,
    judge_event_id,
    new_event_id,
    ngrams_event_id,
)
from contracts.ngrams import NgramKey, hash_label
from gateway.snapshot import UpstreamConfig, VariantConfig
from liftgate import users as u
from liftgate.direct_sink import DirectSink
from liftgate.scenarios import scenario
from liftgate.simulator_process import SimulatorProcess
from tests.analytics.ingest_helpers import count_rows, create_topics, produce, wait_for
from tests.analytics.report_data import create_experiment
from tests.analytics.service.test_app import READ_TOKEN, TOKEN, Service
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source
from tests.known_secrets import secret
from tests.services import analytics_service

STOPPED = "stopped"  # not snapshotted by other modules' service processes
FAST = {"latency_ms": 3.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2, "error_rate": 0.0}
USERS = 300
SECRET = secret("ngram-key")
KEY = NgramKey(SECRET)
STUFFED = "great question"


class TeeSink(MemorySink):
    """The real Direct sink, and a record of every event it was given (to scan them)."""

    def __init__(self, direct: DirectSink) -> None:
        super().__init__()
        self.direct = direct

    def emit(self, event: Event) -> None:
        super().emit(event)
        self.direct.emit(event)

    async def start(self) -> None:
        await self.direct.start()

    async def close(self) -> None:
        await self.direct.close()


async def _traffic(url: str, users: int, seed: int) -> list[str]:
    """Two turns per simulated user, a vote on 60 % of answers; returns the answers' texts."""
    population = u.build_population(users, seed=seed)
    answers: list[str] = []
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as session:

        async def one(user: u.SimUser) -> None:
            rng = random.Random(f"{seed}:{user.user_id}")
            for _ in range(2):
                prompt = u.first_prompt(u.pick_task(user, rng), rng)
                body = {"model": "assistant", "messages": [{"role": "user", "content": prompt}],
                        "user": user.user_id}  # fmt: skip
                async with sem:
                    async with session.post(url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                        data = orjson.loads(await r.read())
                        rid = r.headers["x-request-id"]
                    answers.append(data["choices"][0]["message"]["content"])
                    if rng.random() < 0.6:
                        kind = "thumbs_up" if rng.random() < data["sim_quality"] else "thumbs_down"
                        async with session.post(
                            url + "/v1/feedback", json={"request_id": rid, "kind": kind}
                        ) as r:
                            assert r.status in (200, 202), await r.text()

        await asyncio.gather(*(one(user) for user in population))
    return answers


def _rekeyed(events: list[Event], eid: int) -> list[Event]:
    """The same calls as another experiment's (new request and event ids, same content)."""
    rid = {e.request_id: f"k{e.request_id[1:]}" for e in events if isinstance(e, InteractionEvent)}
    out: list[Event] = []
    for e in events:
        new = rid.get(e.request_id, e.request_id)
        if isinstance(e, NgramsEvent):
            out.append(replace(e, request_id=new, experiment_id=eid, event_id=ngrams_event_id(new)))
        elif isinstance(e, JudgeEvent):
            out.append(replace(e, request_id=new, experiment_id=eid, event_id=judge_event_id(new, e.judge)))
        elif isinstance(e, InteractionEvent | FeedbackEvent):
            out.append(replace(e, request_id=new, experiment_id=eid, event_id=new_event_id()))
    return out


@pytest.fixture(scope="module")
def runs(engine: Engine, database_url: str, kafka_bootstrap: str) -> Iterator[dict[str, Any]]:
    with engine.begin() as conn:
        direct, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
        kafka, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
        conn.execute(text("UPDATE experiments SET content_logging = 'hashed' WHERE id IN (:a, :b)"),
                     {"a": direct, "b": kafka})  # fmt: skip
    sc = scenario("reward-hacking")
    sink = TeeSink(DirectSink(database_url, interval_s=0.05))
    with SimulatorProcess([replace(m, **FAST) for m in sc.models]) as sim:  # type: ignore[arg-type]
        variants = [VariantConfig("control", "sim", "baseline", 50, True),
                    VariantConfig("candidate", "sim", "candidate", 50)]  # fmt: skip
        exp = experiment("assistant", variants, exp_id=direct, content_logging="hashed")
        source = static_source([exp], [UpstreamConfig("sim", sim.url + "/v1", timeout_s=10.0)])
        with start_gateway(sink, source, judge_url=sim.url + "/v1", judge_model="judge", judge_sample_rate=1.0,
                           feedback_rate=0, judge_queue_size=100_000, ngram_key=SECRET, ngram_sample_rate=1.0,
                           ngram_queue_size=100_000) as g:  # fmt: skip
            answers = asyncio.run(_traffic(g.url, USERS, seed=23))

            def all_sampled() -> bool:
                events = list(sink.events)
                done = sum(isinstance(e, NgramsEvent) for e in events)
                judged = sum(isinstance(e, JudgeEvent) for e in events)
                return done >= len(answers) and judged >= len(answers)

            wait_for(all_sampled, 60, "every answer hashed and judged (rates 1.0)")
    events = list(sink.events)
    sql = "SELECT count(*) FROM response_ngrams WHERE experiment_id = %s"
    wait_for(lambda: count_rows(database_url, sql, direct) == len(answers), 60, "the Direct sink's rows")

    # The Kafka path: the same calls as the second experiment, the n-grams delivered twice.
    moved = _rekeyed(events, kafka)
    name = secrets.token_hex(4)
    s = ConsumerSettings(
        database_url=database_url, kafka_bootstrap=kafka_bootstrap, consumer_group=f"g-hashed-{name}",
        interactions_topic=f"i-hashed-{name}", feedback_topic=f"f-hashed-{name}",
        judgements_topic=f"j-hashed-{name}", consumer_max_records=2000, consumer_poll_ms=100,
    )  # fmt: skip
    create_topics(kafka_bootstrap, s.interactions_topic, s.feedback_topic, s.judgements_topic)
    topic = {InteractionEvent: s.interactions_topic, FeedbackEvent: s.feedback_topic,
             JudgeEvent: s.judgements_topic, NgramsEvent: s.judgements_topic}  # fmt: skip
    records = [(topic[type(e)], e.key, encode(e)) for e in moved]
    records += [(s.judgements_topic, e.key, encode(e)) for e in moved if isinstance(e, NgramsEvent)]
    produce(kafka_bootstrap, records)
    stop = threading.Event()
    consumer = threading.Thread(target=run_consumer, args=(s, stop, ConsumerMetrics(CollectorRegistry())))
    consumer.start()
    try:
        wait_for(lambda: count_rows(database_url, sql, kafka) == len(answers), 120, "the consumer's rows")
        feedback = "SELECT count(*) FROM feedback WHERE experiment_id = %s"
        wait_for(
            lambda: count_rows(database_url, feedback, kafka) == count_rows(database_url, feedback, direct),
            60,
            "the feedback on the Kafka path",
        )
    finally:
        stop.set()
        consumer.join(timeout=30)
    assert not consumer.is_alive()
    yield {"direct": direct, "kafka": kafka, "answers": answers, "events": events, "moved": moved,
           "topics": (s.interactions_topic, s.feedback_topic, s.judgements_topic)}  # fmt: skip


@pytest.fixture(scope="module")
def hashed_service(database_url: str, runs: dict[str, Any]) -> Iterator[Service]:
    with analytics_service(
        database_url, TOKEN, read_token=READ_TOKEN, snapshot_interval_s="0", ngram_key=SECRET
    ) as url:
        yield Service(url)


def _phrases(service: Service, eid: int, *phrases: str) -> dict[str, Any]:
    query = "?" + urllib.parse.urlencode([("phrase", p) for p in phrases]) if phrases else ""
    status, body = service.call("GET", f"/api/experiments/{eid}/rl-risks{query}")
    assert status == 200, body
    part: dict[str, Any] = body["rl_risks"][0]["phrases"]
    return part


def test_the_stuffed_phrase_hash_is_flagged_and_resolved_only_by_the_operators_phrase(
    hashed_service: Service, runs: dict[str, Any]
) -> None:
    stuffed = hash_label(KEY.hash(STUFFED))
    tables = {}
    for path in ("direct", "kafka"):
        part = _phrases(hashed_service, runs[path])
        assert part["state"] == "ok" and part["source"] == "hashed", part
        assert part["responses_control"] + part["responses_candidate"] == len(runs["answers"])
        row = next(r for r in part["phrases"] if r["hash"] == stuffed)
        # shown as its hash: nothing resolves it yet
        assert row["flagged"] and row["phrase"] == stuffed and row["resolved"] is False
        assert row["rate_candidate"] > 0.95 and row["rate_control"] < 0.05
        assert row["judge_with"] is not None and stuffed in part["flagged"]
        resolved = _phrases(hashed_service, runs[path], "Great question!", "nothing like this")
        row = next(r for r in resolved["phrases"] if r["hash"] == stuffed)
        assert row["phrase"] == STUFFED and row["resolved"] is True and STUFFED in resolved["flagged"]
        # sub-phrases of the operator's phrase resolve too; unrelated hashes stay hashes
        assert all(
            r["resolved"] == (r["phrase"] in {"great", "question", STUFFED}) for r in resolved["phrases"]
        )
        tables[path] = [(r["hash"], r["rate_control"], r["rate_candidate"], r["z"]) for r in part["phrases"]]
    # one set of calls, two delivery paths: the same table
    assert tables["direct"] == tables["kafka"]


def test_the_response_text_never_reaches_an_event_or_a_table(
    engine: Engine, runs: dict[str, Any], database_url: str
) -> None:
    answers: list[str] = runs["answers"]
    assert sum(STUFFED in a.lower() for a in answers) > len(answers) / 3  # the candidate's half
    needles = {STUFFED} | {a[:40].lower() for a in answers if len(a) >= 40}
    grams = [e for e in runs["events"] if isinstance(e, NgramsEvent)]
    assert len(grams) == len(answers) and all(e.key_id == KEY.key_id and e.grams for e in grams)
    for e in (*runs["events"], *runs["moved"]):
        blob = encode(e).decode().lower()
        assert not any(n in blob for n in needles), type(e).__name__
    with engine.connect() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                text(
                    "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public'"
                    " AND column_name = 'experiment_id' ORDER BY 1"
                )
            )
        ]
        assert {"interactions", "feedback", "judgements", "response_ngrams", "unit_rollups"} <= set(tables)
        for table in tables:
            rows = conn.execute(
                text(f"SELECT t::text FROM {table} t WHERE experiment_id IN (:a, :b)"),
                {"a": runs["direct"], "b": runs["kafka"]},
            ).all()
            for (row,) in rows:
                assert not any(n in row.lower() for n in needles), table
        stored = conn.execute(
            text("SELECT count(*) FROM response_ngrams WHERE experiment_id IN (:a, :b)"),
            {"a": runs["direct"], "b": runs["kafka"]},
        ).scalar()
        assert stored == 2 * len(answers)  # delivered twice on the Kafka path, stored once
        dead = conn.execute(
            text("SELECT count(*) FROM dead_letters WHERE topic = ANY(:t)"), {"t": list(runs["topics"])}
        ).scalar()
        assert dead == 0
    assert count_rows(database_url, "SELECT count(*) FROM interactions WHERE response IS NOT NULL AND "
                      "experiment_id = %s AND length(response) <> 64", runs["direct"]) == 0  # fmt: skip


def test_a_phrase_lookup_is_bounded(hashed_service: Service, runs: dict[str, Any]) -> None:
    query = urllib.parse.urlencode([("phrase", f"p{i}") for i in range(101)])
    status, _ = hashed_service.call("GET", f"/api/experiments/{runs['direct']}/rl-risks?{query}")
    assert status == 422
    status, _ = hashed_service.call("GET", f"/api/experiments/{runs['direct']}/rl-risks?phrase={'x' * 201}")
    assert status == 422
    status, _ = hashed_service.call("GET", f"/api/experiments/{runs['direct']}/rl-risks?phrase=a%00b")
    assert status == 422
