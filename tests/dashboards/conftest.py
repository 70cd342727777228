"""A real stack for the Prometheus test: the model simulator, the gateway (events to Kafka),
the analytics service (snapshotter and rollout controller on), and Debian's Prometheus
scraping both every second with the job names of ``dashboards/prometheus.yml``."""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from contracts.events import FeedbackEvent, InteractionEvent, encode
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.known_secrets import secret
from tests.services import ROOT, analytics_service, child, free_port, http

PROMETHEUS = "/usr/bin/prometheus"
SCRAPE_INTERVAL = "1s"


@dataclass(frozen=True, slots=True)
class Stack:
    gateway: str
    analytics: str
    prometheus: str
    admin_token: str
    routes: tuple[str, ...]

    def query(self, expr: str) -> dict[str, Any]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http("GET", url)
        doc: dict[str, Any] = json.loads(body)
        doc["http_status"] = status
        return doc


def prometheus_config(targets: dict[str, str]) -> dict[str, Any]:
    """``dashboards/prometheus.yml`` with the targets replaced and a 1 s scrape interval."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "dashboards" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = SCRAPE_INTERVAL
    config["global"]["evaluation_interval"] = SCRAPE_INTERVAL
    for job in config["scrape_configs"]:
        job["static_configs"][0]["targets"] = [targets[job["job_name"]]]
    return config


@contextlib.contextmanager
def prometheus(config: dict[str, Any], workdir: Path) -> Iterator[str]:
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        PROMETHEUS,
        f"--config.file={path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    url = f"http://127.0.0.1:{port}"
    with child(cmd, {}, f"{url}/-/ready", deadline_s=60):
        yield url


@dataclass(frozen=True, slots=True)
class Topics:
    interactions: str
    feedback: str


@contextlib.contextmanager
def private_topics(bootstrap: str, suffix: str) -> Iterator[Topics]:
    """Topics only this test's consumer reads: the shared ones belong to other tests'
    consumers, and a deliberately malformed message must not reach them."""
    topics = Topics(f"liftgate.interactions.prom-{suffix}", f"liftgate.feedback.prom-{suffix}")
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        client.create_topics(
            [
                NewTopic(t, num_partitions=2, replication_factor=1)
                for t in (topics.interactions, topics.feedback)
            ]
        )
        yield topics
    finally:
        with contextlib.suppress(Exception):
            client.delete_topics([topics.interactions, topics.feedback])
        client.close()


def feed_consumer(bootstrap: str, topics: Topics, experiment_id: int, route: str, n: int) -> None:
    """Real events (and one undecodable message, which must be dead-lettered) for the consumer."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i in range(n):
            unit = f"fed-{i % 25}"
            event = InteractionEvent(
                request_id=f"fed-{experiment_id}-{i}-{secrets.token_hex(3)}", route=route, unit_id=unit,
                unit_source="header", role="primary", mode="ab", endpoint="chat", model="baseline",
                upstream="sim", status="ok", http_status=200, latency_ms=20.0 + i % 7,
                experiment_id=experiment_id, variant="baseline" if i % 2 else "candidate",
                completion_tokens=40, response_chars=160,
            )  # fmt: skip
            producer.send(topics.interactions, key=unit.encode(), value=encode(event))
            if i % 3 == 0:
                fb = FeedbackEvent(request_id=event.request_id, unit_id=unit, kind="thumbs_up")
                producer.send(topics.feedback, key=unit.encode(), value=encode(fb))
        producer.send(topics.interactions, key=b"garbage", value=b"{not an event")
        producer.flush(30)
    finally:
        producer.close(10)


def admin(gateway: str, token: str, method: str, path: str, body: Any = None) -> Any:
    status, raw = http(method, f"{gateway}{path}", {"Authorization": f"Bearer {token}"}, body=body)
    assert status in (200, 201), f"{method} {path}: {status} {raw[:400]!r}"
    return json.loads(raw) if raw else None


def configure(gateway: str, token: str, sim_url: str, suffix: str) -> tuple[str, ...]:
    """An A/B route with fallback, a shadow route and a rollout route, all started."""
    admin(
        gateway,
        token,
        "POST",
        "/admin/upstreams",
        {"name": f"sim-{suffix}", "base_url": sim_url, "timeout_s": 10},
    )
    up = f"sim-{suffix}"
    ab, shadow, rollout = f"prom-ab-{suffix}", f"prom-shadow-{suffix}", f"prom-rollout-{suffix}"
    experiments: list[dict[str, Any]] = [
        {
            "name": ab,
            "route": ab,
            "mode": "ab",
            "fallback_to_control": True,
            "variants": [
                {"name": "baseline", "upstream": up, "model": "baseline", "weight": 50, "is_control": True},
                {"name": "candidate", "upstream": up, "model": "flaky", "weight": 50},
            ],
        },
        {
            "name": shadow,
            "route": shadow,
            "mode": "shadow",
            "shadow_sample_rate": 1.0,
            "variants": [
                {"name": "baseline", "upstream": up, "model": "baseline", "weight": 100, "is_control": True},
                {"name": "candidate", "upstream": up, "model": "verbose", "weight": 0},
            ],
        },
        {
            "name": rollout,
            "route": rollout,
            "mode": "rollout",
            # Long minimums: the controller starts the rollout and then holds at 5%.
            "rollout_plan": {
                "stages": [5, 25, 100],
                "min_duration_s": 3600,
                "min_units": 100000,
                "interval_s": 1,
            },
            "variants": [
                {"name": "baseline", "upstream": up, "model": "baseline", "weight": 100, "is_control": True},
                {"name": "candidate", "upstream": up, "model": "verbose", "weight": 0},
            ],
        },
    ]
    for exp in experiments:
        admin(gateway, token, "POST", "/admin/experiments", exp)
        admin(gateway, token, "POST", f"/admin/experiments/{exp['name']}/start")
    return (ab, shadow, rollout)


def send_traffic(gateway: str, routes: tuple[str, ...], rounds: int, offset: int) -> int:
    """Chat completions (JSON and SSE) from several units on every route, plus feedback."""
    ok = 0
    for i in range(rounds):
        for route in routes:
            unit = f"unit-{offset + i}"
            stream = i % 2 == 1
            body = {
                "model": route,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "stream": stream,
            }
            status, raw = http(
                "POST", f"{gateway}/v1/chat/completions", {"X-Liftgate-Unit": unit}, timeout=20, body=body
            )
            ok += status == 200
            if status == 200 and not stream:
                rid = json.loads(raw).get("id", "")
                http("POST", f"{gateway}/v1/feedback", {}, body={"request_id": rid, "kind": "thumbs_up"})
    return ok


@pytest.fixture(scope="module")
def stack(
    module_database_url: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    database_url = module_database_url
    token = secret("prom")
    suffix = secrets.token_hex(3)
    workdir = tmp_path_factory.mktemp("prometheus")
    models = [
        SimulatorModel("baseline", latency_ms=15, latency_sd=3, ttft_ms=5, ttft_sd=1, tokens=40, seed=1),
        SimulatorModel(
            "flaky", latency_ms=20, latency_sd=4, ttft_ms=6, ttft_sd=1, tokens=50, error_rate=0.3, seed=2
        ),
        SimulatorModel("verbose", latency_ms=25, latency_sd=4, ttft_ms=7, ttft_sd=1, tokens=80, seed=3),
    ]
    gw_port = free_port()
    gateway = f"http://127.0.0.1:{gw_port}"
    gw_env: dict[str, str | None] = {
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_ADMIN_TOKEN": token,
        "LIFTGATE_CLIENT_KEYS": "off",
        "LIFTGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LIFTGATE_SPOOL_DIR": str(workdir / "spool"),
        "LIFTGATE_LOG_LEVEL": "warning",
        "PROMETHEUS_MULTIPROC_DIR": None,
    }
    gw_cmd = [sys.executable, "-m", "gateway", "--port", str(gw_port), "--workers", "1"]
    with (
        SimulatorProcess(models) as sim,
        child(gw_cmd, gw_env, f"{gateway}/healthz", deadline_s=90),
        private_topics(kafka_bootstrap, suffix) as topics,
        analytics_service(
            database_url,
            token,
            snapshot_interval_s="1",
            rollout_controller="true",
            rollout_tick_s="0.5",
            kafka_bootstrap=kafka_bootstrap,
            consumer_group=f"prom-test-{suffix}",
            interactions_topic=topics.interactions,
            feedback_topic=topics.feedback,
            judgements_topic=f"{topics.interactions}.judgements",  # not the shared broker's default
        ) as analytics,
    ):
        routes = configure(gateway, token, sim.url, suffix)
        wait_routed(gateway, routes)
        config = prometheus_config(
            {"liftgate-gateway": f"127.0.0.1:{gw_port}", "liftgate-analytics": analytics[7:]}
        )
        with prometheus(config, workdir) as prom:
            ab_id = admin(gateway, token, "GET", f"/admin/experiments/{routes[0]}")["id"]
            feed_consumer(kafka_bootstrap, topics, int(ab_id), routes[0], 200)
            yield Stack(gateway, analytics, prom, token, routes)


def wait_routed(gateway: str, routes: tuple[str, ...], deadline_s: float = 10) -> None:
    """The gateway refreshes its config in the background: wait until every route answers."""
    end = time.monotonic() + deadline_s
    pending = set(routes)
    while pending and time.monotonic() < end:
        for route in list(pending):
            body = {"model": route, "messages": [{"role": "user", "content": "ping"}]}
            status, _ = http(
                "POST", f"{gateway}/v1/chat/completions", {"X-Liftgate-Unit": "probe"}, body=body
            )
            if status != 404:
                pending.discard(route)
        time.sleep(0.1)
    assert not pending, f"routes never became routable: {pending}"
