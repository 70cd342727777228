"""A static group member fenced by another with its ``group.instance.id`` (Kafka's answer to a
duplicate id, and librdkafka's to a member that rejoined under load while an old request of
its own was in flight) makes its client unusable for good: the consumer replaces the client
and carries on from the committed offsets, exactly once; when fencing does not stop, it gives
up visibly instead of idling with a dead client."""

from __future__ import annotations

import random
import threading
import time

from prometheus_client import CollectorRegistry

from analytics.ingest.consumer import (
    ConsumerGaveUp,
    ConsumerMetrics,
    ConsumerSettings,
    run_consumer,
)
from contracts.events import Event, InteractionEvent
from eventbus import ClientChoice
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    connect,
    count_rows,
    create_topics,
    declared_experiment,
    event_records,
    expected_rollups,
    intrude_as_static_member,
    produce,
    random_events,
    stored_rollups,
    wait_for,
)

RESTARTS = "liftgate_analytics_consumer_client_restarts_total"


def _settings(database_url: str, bootstrap: str, unique_name: str, client: ClientChoice) -> ConsumerSettings:
    return ConsumerSettings(
        database_url=database_url,
        kafka_bootstrap=bootstrap,
        consumer_group=f"g-{unique_name}",
        interactions_topic=f"i-{unique_name}",
        feedback_topic=f"f-{unique_name}",
        judgements_topic=f"j-{unique_name}",
        consumer_instance_id=f"m-{unique_name}",
        consumer_max_records=300,
        consumer_poll_ms=50,
        consumer_session_timeout_ms=6_000,
        consumer_max_backoff_s=1.0,
        consumer_sweep_interval_s=1.0,
        kafka_client=client,
    )


def _interactions(events: list[Event]) -> int:
    return sum(1 for e in events if isinstance(e, InteractionEvent))


def _all_ingested(database_url: str, exp: int, events: list[Event]) -> bool:
    got_i = count_rows(database_url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)
    got_f = count_rows(database_url, "SELECT count(*) FROM feedback WHERE experiment_id = %s", exp)
    return got_i == _interactions(events) and got_f == len(events) - _interactions(events)


def test_a_fenced_static_member_replaces_its_client_and_ingests_every_event_exactly_once(
    database_url: str, kafka_bootstrap: str, unique_name: str, kafka_client: ClientChoice
) -> None:
    settings = _settings(database_url, kafka_bootstrap, unique_name, kafka_client)
    topics = (settings.interactions_topic, settings.feedback_topic)
    create_topics(kafka_bootstrap, *topics)
    exp = declared_experiment(database_url)
    rng = random.Random(5)
    before, during, after = (random_events(exp, 900, rng, units=60) for _ in range(3))
    events = before + during + after
    metrics = ConsumerMetrics(CollectorRegistry())
    errors: list[BaseException] = []
    stop = threading.Event()

    def consume() -> None:
        try:
            run_consumer(settings, stop, metrics)
        except BaseException as exc:
            errors.append(exc)
            raise

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        produce(kafka_bootstrap, event_records(before, *topics))
        wait_for(lambda: _all_ingested(database_url, exp, before), 60, "ingest before the fence", 0.05)
        intrude_as_static_member(settings)
        produce(kafka_bootstrap, event_records(during, *topics))
        wait_for(lambda: (metrics.registry.get_sample_value(RESTARTS) or 0) >= 1, 60, "a new client")
        produce(kafka_bootstrap, event_records(after, *topics))
        wait_for(lambda: _all_ingested(database_url, exp, events), 90, "every event after the fence", 0.1)
        assert consumer.is_alive() and not errors
    finally:
        stop.set()
        consumer.join(timeout=60)
    assert not consumer.is_alive()
    assert not errors, errors
    with connect(database_url) as conn:
        assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(events))


def test_a_member_fenced_again_and_again_gives_up_with_an_error_instead_of_idling(
    database_url: str, kafka_bootstrap: str, unique_name: str
) -> None:
    """Two live processes configured with the same instance id fence each other without end;
    after ``consumer_max_client_restarts`` new clients within the window the consumer raises,
    so its thread ends with the reason (the service's health turns red) rather than idling."""
    settings = _settings(database_url, kafka_bootstrap, unique_name, "confluent").model_copy(
        update={"consumer_max_client_restarts": 2}
    )
    create_topics(kafka_bootstrap, settings.interactions_topic, settings.feedback_topic)
    metrics = ConsumerMetrics(CollectorRegistry())
    errors: list[BaseException] = []
    stop = threading.Event()

    def consume() -> None:
        try:
            run_consumer(settings, stop, metrics)
        except BaseException as exc:
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        deadline = time.monotonic() + 120
        while consumer.is_alive() and time.monotonic() < deadline:
            intrude_as_static_member(settings)
            consumer.join(timeout=2.0)  # the consumer's next heartbeat finds it fenced
    finally:
        stop.set()
        consumer.join(timeout=60)
    assert not consumer.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConsumerGaveUp), errors
    assert metrics.registry.get_sample_value(RESTARTS) == 2
