"""End to end: requests through the gateway become events in the real Kafka broker."""

from __future__ import annotations

from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from contracts.events import FeedbackEvent, InteractionEvent
from gateway.app import create_app
from gateway.kafka_sink import KafkaSink, Topics, ensure_topics
from gateway.snapshot import UpstreamConfig, VariantConfig
from gateway.telemetry import GatewayMetrics
from tests.gateway.conftest import GatewayThread, experiment, post, settings, static_source
from tests.gateway.kafka_helpers import consume

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "An email: bob@example.com, id 123456"}]


def test_every_request_and_feedback_reaches_kafka(
    kafka_bootstrap: str, simulator: str, unique_name: str, tmp_path: Path
) -> None:
    topics = Topics(interactions=f"{unique_name}.interactions", feedback=f"{unique_name}.feedback")
    ensure_topics(kafka_bootstrap, 3, topics)
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics)
    variants = [VariantConfig("control", "sim", "base", 50, True), VariantConfig("cand", "sim", "cand", 50)]
    source = static_source(
        [experiment("kafka-route", variants, content_logging="full")], [UpstreamConfig("sim", simulator)]
    )
    app = create_app(settings(), sink, config_source=source, metrics=GatewayMetrics())
    request_ids: dict[str, str] = {}
    with GatewayThread(app) as g:
        client = openai.OpenAI(
            base_url=g.url + "/v1", api_key="k", default_headers={"X-Liftgate-Show-Variant": "true"}
        )
        for i in range(20):
            raw = client.chat.completions.with_raw_response.create(
                model="kafka-route", messages=MSG, user=f"user-{i % 7}", stream=i % 2 == 0
            )
            raw.parse()
            request_ids[raw.headers["x-request-id"]] = raw.headers["x-liftgate-variant"]
        first = next(iter(request_ids))
        assert (
            post(g.url + "/v1/feedback", {"request_id": first, "kind": "rating", "value": 4}).status_code
            == 202
        )
    received = consume(kafka_bootstrap, [topics.interactions, topics.feedback], len(request_ids) + 1)
    interactions = {e.request_id: e for e in received if isinstance(e, InteractionEvent)}
    assert set(interactions) == set(request_ids)
    for rid, variant in request_ids.items():
        ev = interactions[rid]
        assert ev.variant == variant and ev.experiment == "exp-kafka-route" and ev.status == "ok"
        assert ev.prompt is not None and "bob@example.com" not in ev.prompt and "<email>" in ev.prompt
        assert ev.response and ev.completion_tokens
    (fb,) = [e for e in received if isinstance(e, FeedbackEvent)]
    assert (fb.request_id, fb.kind, fb.value, fb.variant) == (first, "rating", 4.0, request_ids[first])
