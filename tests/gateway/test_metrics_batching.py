"""Request counts of one gateway process are added up in integers and reach the Prometheus
counters at every scrape (``render``) and config refresh tick (``flush``); with several worker
processes they are written at once. Either way a scrape shows every request counted so far."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.telemetry import GatewayMetrics


def sample(m: GatewayMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


LABELS = {"route": "r", "experiment": "e", "variant": "v"}


def test_batched_counts_reach_the_counters_at_the_scrape_and_at_a_flush() -> None:
    m = GatewayMetrics(CollectorRegistry())
    assert m.batched
    ch = m.children("r", "e", "v", "primary")
    for status_class in ("2xx", "2xx", "4xx", "5xx"):
        ch.count(status_class, 10, 3)
        m.count_interaction()
    ch.count("2xx", None, 0)  # no usage reported: no tokens
    assert sample(m, "liftgate_gateway_requests_total", **LABELS, role="primary", status_class="2xx") == 0
    text = m.render()[0].decode()  # the scrape flushes first
    assert 'status_class="2xx",variant="v"} 3.0' in text
    assert 'status_class="4xx",variant="v"} 1.0' in text
    assert 'status_class="5xx",variant="v"} 1.0' in text
    assert sample(m, "liftgate_gateway_tokens_total", **LABELS, kind="prompt") == 40
    assert sample(m, "liftgate_gateway_tokens_total", **LABELS, kind="completion") == 12
    assert sample(m, "liftgate_gateway_events_emitted_total", type="interaction") == 4
    ch.count("2xx", 1, 1)
    m.count_interaction()
    m.flush()  # the refresh tick's flush, without a scrape
    m.flush()  # nothing pending: nothing added twice
    assert sample(m, "liftgate_gateway_requests_total", **LABELS, role="primary", status_class="2xx") == 4
    assert sample(m, "liftgate_gateway_events_emitted_total", type="interaction") == 5
    assert sample(m, "liftgate_gateway_tokens_total", **LABELS, kind="prompt") == 41


def test_counts_survive_the_children_cache_being_cleared() -> None:
    m = GatewayMetrics(CollectorRegistry())
    m.children("r", "e", "v", "primary").count("2xx", 5, 5)
    for i in range(10_001):  # a pathological config churn clears the cache
        m.children("r", "e", f"other-{i}", "primary")
    assert sample(m, "liftgate_gateway_requests_total", **LABELS, role="primary", status_class="2xx") == 1
    assert sample(m, "liftgate_gateway_tokens_total", **LABELS, kind="prompt") == 5


def test_with_several_workers_every_count_is_written_at_once() -> None:
    m = GatewayMetrics(CollectorRegistry())
    m.batched = False  # what a process of `--workers N` (PROMETHEUS_MULTIPROC_DIR set) decides
    ch = m.children("r", "e", "v", "primary")
    ch.count("4xx", 7, None)
    m.count_interaction()
    assert sample(m, "liftgate_gateway_requests_total", **LABELS, role="primary", status_class="4xx") == 1
    assert sample(m, "liftgate_gateway_tokens_total", **LABELS, kind="prompt") == 7
    assert sample(m, "liftgate_gateway_events_emitted_total", type="interaction") == 1
