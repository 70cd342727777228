"""The shadow queue is bounded by bytes as well as by count.

Reproduces issue 13: the queue was bounded by count only (1,000 × the request size), so
300 shadowed 1 MiB requests to a hanging candidate grew the gateway by 306 MiB.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gateway.settings import KiB, MiB
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    ADMIN_TOKEN,
    GatewayProcess,
    MemorySink,
    PeakRss,
    experiment,
    get,
    http,
    post,
    start_gateway,
    static_source,
)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _shadow_count(metrics: str, route: str, outcome: str) -> float:
    """Sum of ``liftgate_gateway_shadow_total`` for one route and outcome (labels in any order)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("liftgate_gateway_shadow_total{"):
            labels, value = line.rsplit(" ", 1)
            if f'route="{route}"' in labels and f'outcome="{outcome}"' in labels:
                total += float(value)
    return total


def test_mirrors_beyond_the_byte_budget_are_dropped_and_counted(simulator: str) -> None:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator), UpstreamConfig("sim-hang", simulator, timeout_s=30.0)]
    exps = [
        experiment(
            "mirrored",
            [VariantConfig("control", "sim", "base", 1, True), VariantConfig("hang", "sim-hang", "hanger")],
            mode="shadow",
        )
    ]
    source = static_source(exps, ups)
    # Room for 4 mirrors of ~200 KiB by bytes, 1,000 by count, 64 workers: bytes must decide.
    with start_gateway(sink, source, shadow_queue_bytes=900 * KiB, shadow_concurrency=64) as g:
        content = "z" * (200 * KiB)
        for i in range(12):
            body = {"model": "mirrored", "messages": [{"role": "user", "content": content}], "user": f"u{i}"}
            assert post(g.url + "/v1/chat/completions", body).status_code == 200
        # Mirrors are decided just after each answer: wait (bounded) for the last decision.
        deadline = time.monotonic() + 3
        while True:
            text = get(g.url + "/metrics").text
            sent, dropped = (
                _shadow_count(text, "mirrored", "sent"),
                _shadow_count(text, "mirrored", "dropped"),
            )
            if sent + dropped == 12 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert (sent, dropped) == (4, 8)
        shadow = g.app.runtime.shadow
        assert shadow is not None and 4 * 200 * KiB <= shadow.held_bytes <= 900 * KiB


@pytest.mark.slow
def test_three_hundred_shadowed_one_mib_requests_keep_the_gateway_small(
    database_url: str, simulator: str, unique_name: str
) -> None:
    """300 × 1 MiB requests mirrored to a candidate that never answers, 4 clients at a time:
    the gateway process grows by well under the 300 MiB the mirrors would hold (16 MiB budget)."""
    with GatewayProcess(
        database_url, LIFTGATE_CLIENT_KEYS="off", LIFTGATE_SHADOW_QUEUE_BYTES=str(16 * MiB)
    ) as g:
        up = f"up-{unique_name}"
        assert (
            http(
                "POST", g.url + "/admin/upstreams", {"name": up, "base_url": simulator}, headers=AUTH
            ).status_code
            == 201
        )
        hang = f"hang-{unique_name}"
        body: dict[str, Any] = {"name": hang, "base_url": simulator, "timeout_s": 120}
        assert http("POST", g.url + "/admin/upstreams", body, headers=AUTH).status_code == 201
        exp = {
            "name": unique_name,
            "route": unique_name,
            "mode": "shadow",
            "variants": [
                {"name": "control", "upstream": up, "model": "base", "weight": 1, "is_control": True},
                {"name": "hang", "upstream": hang, "model": "hanger", "weight": 0},
            ],
        }
        assert http("POST", g.url + "/admin/experiments", exp, headers=AUTH).status_code == 201
        assert (
            http("POST", g.url + f"/admin/experiments/{unique_name}/start", headers=AUTH).status_code == 200
        )
        small = {"model": unique_name, "messages": [{"role": "user", "content": "warm up"}]}
        deadline = time.monotonic() + 5
        while post(g.url + "/v1/chat/completions", small).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        baseline = g.rss()
        content = "m" * MiB
        statuses: list[int] = []

        def client(k: int) -> None:
            for i in range(75):
                msg = {
                    "model": unique_name,
                    "messages": [{"role": "user", "content": content}],
                    "user": f"c{k}-{i}",
                }
                statuses.append(post(g.url + "/v1/chat/completions", msg, timeout=30).status_code)

        with PeakRss(g) as peak:
            threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
        assert statuses == [200] * 300
        growth = peak.peak - baseline
        deadline = time.monotonic() + 3  # the last mirror is decided just after its answer
        while True:
            text = get(g.url + "/metrics").text
            sent, dropped = (
                _shadow_count(text, unique_name, "sent"),
                _shadow_count(text, unique_name, "dropped"),
            )
            if sent + dropped >= 301 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert growth < 64 * MiB, f"gateway grew by {growth / MiB:.1f} MiB"
        assert sent + dropped == 301 and sent <= 17, (sent, dropped)
