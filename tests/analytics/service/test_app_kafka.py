"""The service runs the Kafka consumer in a thread: events produced to a real broker show up
in the report, and the consumer's metrics on the service's /metrics."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from sqlalchemy import Engine

from analytics.ingest.consumer import ConsumerSettings
from contracts.events import InteractionEvent, encode
from tests.analytics.ingest_helpers import intrude_as_static_member
from tests.analytics.report_data import T0, create_experiment
from tests.analytics.service.test_app import READ_TOKEN, TOKEN, Service
from tests.services import analytics_service

DEADLINE_S = 60.0


@pytest.fixture
def topics(kafka_bootstrap: str, unique_name: str) -> Iterator[tuple[str, str, str]]:
    # All three topics the consumer reads are the test's own: the broker is shared, and the
    # default judgements topic holds what other tests' gateways sent (they were counted here).
    names = (f"it-{unique_name}", f"fb-{unique_name}", f"jd-{unique_name}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=20_000)
    admin.create_topics([NewTopic(n, num_partitions=2, replication_factor=1) for n in names])
    yield names
    admin.delete_topics(list(names))
    admin.close()


@pytest.fixture
def kafka_service(database_url: str, kafka_bootstrap: str, topics: tuple[str, str, str]) -> Iterator[Service]:
    with analytics_service(
        database_url,
        TOKEN,
        read_token=READ_TOKEN,
        kafka_bootstrap=kafka_bootstrap,
        interactions_topic=topics[0],
        feedback_topic=topics[1],
        judgements_topic=topics[2],
        consumer_group=f"g-{secrets.token_hex(6)}",
        snapshot_interval_s="0",
        rollout_controller="false",
        notify_worker="false",
        retention_interval_s="0",
        rl_compact_interval_s="0",  # only the consumer runs
        fresh_min_interval_s="0",  # the test polls fresh reports
    ) as url:
        yield Service(url)


def test_events_from_kafka_reach_the_report(
    kafka_service: Service, kafka_bootstrap: str, topics: tuple[str, str, str], engine: Engine
) -> None:
    with engine.begin() as conn:
        eid, name = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["error_rate"])
    status, health = kafka_service.call("GET", "/healthz")
    assert status == 200
    assert health["workers"] == {"consumer": True}
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    units = 60
    for u in range(units):
        for k in range(2):
            ev = InteractionEvent(
                request_id=f"{name}-{u}-{k}", route=f"route-{name}", unit_id=f"u{u}", unit_source="header",
                role="primary", mode="ab", endpoint="chat", model="m", upstream="up",
                status="error" if (u + k) % 7 == 0 else "ok", http_status=200, latency_ms=100.0 + u,
                experiment_id=eid, experiment=name, variant="control" if u % 2 else "candidate",
                ts=T0.timestamp() + u,
            )  # fmt: skip
            producer.send(topics[0], key=ev.key, value=encode(ev))
    producer.flush(30)
    producer.close()
    deadline = time.monotonic() + DEADLINE_S
    report: dict[str, Any] = {}
    while time.monotonic() < deadline:
        _, report = kafka_service.call("GET", f"/api/experiments/{eid}/report?fresh=1", token=TOKEN)
        if report.get("units") == units:
            break
        time.sleep(0.2)
    assert report.get("units") == units, (
        f"after {DEADLINE_S}s: {report.get('units')} units, errors {report.get('errors')}"
    )
    assert {a["variant"]: a["observed_units"] for a in report["allocation"]} == {
        "control": 30,
        "candidate": 30,
    }
    # the counter moves once the batch's transaction committed (the offsets follow)
    consumed = 0.0
    while time.monotonic() < deadline and consumed < 2 * units:
        _, metrics = kafka_service.call("GET", "/metrics")
        lines = [x for x in metrics.splitlines() if x.startswith("liftgate_analytics_events_consumed_total")]
        consumed = sum(float(x.rsplit(" ", 1)[1]) for x in lines)
        time.sleep(0.1)
    assert consumed == 2 * units, f"consumed counter {consumed}"


def test_health_turns_red_when_the_consumer_gives_up_on_a_client_fenced_without_end(
    database_url: str, kafka_bootstrap: str, topics: tuple[str, str, str], unique_name: str
) -> None:
    """A consumer whose new clients keep being fenced (here: a second member with its
    instance id rejoining again and again) stops after its replacement budget: /healthz then
    answers 503 naming the dead worker, instead of 200 over a service that ingests nothing."""
    group, instance = f"g-{unique_name}", f"m-{unique_name}"
    with analytics_service(
        database_url,
        TOKEN,
        kafka_bootstrap=kafka_bootstrap,
        interactions_topic=topics[0],
        feedback_topic=topics[1],
        judgements_topic=topics[2],
        consumer_group=group,
        consumer_instance_id=instance,
        consumer_session_timeout_ms="6000",
        consumer_max_backoff_s="1",
        consumer_max_client_restarts="1",
        kafka_client="confluent",
        snapshot_interval_s="0",
        rollout_controller="false",
        notify_worker="false",
        retention_interval_s="0",
        rl_compact_interval_s="0",
    ) as url:
        service = Service(url)
        assert service.call("GET", "/healthz")[0] == 200
        intruder = ConsumerSettings(
            kafka_bootstrap=kafka_bootstrap,
            consumer_group=group,
            consumer_instance_id=instance,
            interactions_topic=topics[0],
            feedback_topic=topics[1],
            judgements_topic=topics[2],
            consumer_session_timeout_ms=6000,
            kafka_client="confluent",
        )
        deadline = time.monotonic() + 90
        status, health = service.call("GET", "/healthz")
        while status == 200 and time.monotonic() < deadline:
            intrude_as_static_member(intruder)
            # The fenced consumer finds out at its next heartbeat (within 1 s), then backs off.
            for _ in range(10):
                status, health = service.call("GET", "/healthz")
                if status != 200:
                    break
                time.sleep(0.3)
        assert status == 503, health
        assert health == {"status": "failing", "workers": {"consumer": False}}
        _, metrics = service.call("GET", "/metrics")
        assert 'liftgate_analytics_worker_up{worker="consumer"} 0.0' in metrics
        assert "liftgate_analytics_consumer_client_restarts_total 1.0" in metrics
