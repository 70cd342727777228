"""Events really travel through the Apache Kafka broker and come back intact."""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from contracts.events import FeedbackEvent, InteractionEvent, decode, encode


def _interaction(i: int) -> InteractionEvent:
    return InteractionEvent(
        request_id=f"req-{i}",
        route="assistant",
        unit_id=f"user-{i % 7}",
        unit_source="header",
        role="primary",
        mode="ab",
        endpoint="chat",
        model="m",
        upstream="u",
        status="ok",
        http_status=200,
        latency_ms=float(i),
        experiment_id=1,
        variant="control" if i % 2 else "candidate",
    )


def test_events_produced_to_the_broker_are_read_back_in_order_per_unit(
    kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"t-{unique_name}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()

    sent: list[InteractionEvent | FeedbackEvent] = [_interaction(i) for i in range(200)]
    sent.append(FeedbackEvent(request_id="req-3", unit_id="user-3", kind="thumbs_up"))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for event in sent:
        producer.send(topic, key=event.key, value=encode(event))
    producer.flush(timeout=30)
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=f"g-{unique_name}",
    )
    received = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received.extend(records)
    finally:
        consumer.close()

    assert sorted(decode(r.value).event_id for r in received) == sorted(e.event_id for e in sent)
    # Kafka key = unit id, so each unit's events stay ordered in one partition.
    by_unit: dict[bytes, list[str]] = {}
    partitions: dict[bytes, set[int]] = {}
    for r in received:
        by_unit.setdefault(r.key, []).append(decode(r.value).event_id)
        partitions.setdefault(r.key, set()).add(r.partition)
    for key, ids in by_unit.items():
        assert ids == sorted(ids), f"events of {key!r} out of order"
        assert len(partitions[key]) == 1
