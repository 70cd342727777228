"""``python -m gateway --workers 2``: /metrics aggregates every worker (prometheus multiprocess mode)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from tests.gateway.conftest import ADMIN_TOKEN, free_port, get, http, post

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _total(text: str, route: str) -> float:
    pattern = re.compile(r"^liftgate_gateway_requests_total\{([^}]*)\} (\S+)$", re.M)
    return sum(float(v) for labels, v in pattern.findall(text) if f'route="{route}"' in labels)


def test_metrics_count_requests_of_all_workers(
    database_url: str, simulator: str, unique_name: str, tmp_path: object
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "LIFTGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_LOG_LEVEL": "warning",
        "LIFTGATE_REFRESH_INTERVAL_S": "0.2",
        "LIFTGATE_CLIENT_KEYS": "off",
    }
    env.pop("LIFTGATE_KAFKA_BOOTSTRAP", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--port", str(port), "--workers", "2"],
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "gateway did not start"
            time.sleep(0.1)
        up = f"up-{unique_name}"
        assert (
            http(
                "POST", url + "/admin/upstreams", {"name": up, "base_url": simulator}, headers=AUTH
            ).status_code
            == 201
        )
        exp = {
            "name": unique_name,
            "route": unique_name,
            "mode": "ab",
            "variants": [
                {"name": "control", "upstream": up, "model": "base", "weight": 1, "is_control": True},
                {"name": "cand", "upstream": up, "model": "cand", "weight": 1},
            ],
        }
        assert http("POST", url + "/admin/experiments", exp, headers=AUTH).status_code == 201
        assert http("POST", url + f"/admin/experiments/{unique_name}/start", headers=AUTH).status_code == 200
        body = {"model": unique_name, "messages": [{"role": "user", "content": "hi"}]}
        # Each worker refreshes its config every 0.2 s on its own: keep asking for 1 s after the
        # first answer, so both have the route; count the answers (a 404 is not the route's).
        before, deadline, settled = 0, time.monotonic() + 5, None
        while settled is None or time.monotonic() < settled:
            if post(url + "/v1/chat/completions", body).status_code == 200:
                before += 1
                settled = settled or time.monotonic() + 1
            assert time.monotonic() < deadline, "the route did not become servable in 5 s"
        n = 40
        for i in range(n):  # one connection per request: the kernel spreads them over both workers
            assert post(url + "/v1/chat/completions", {**body, "user": f"u{i}"}).status_code == 200
        # A worker counts a request just after writing its answer (the answer is not held up
        # for the counters), so a scrape answered by the other worker may, for an instant,
        # miss the last one: wait until every request shows, then it must stay exact.
        deadline = time.monotonic() + 5
        while (seen := _total(get(url + "/metrics").text, unique_name)) < before + n:
            assert time.monotonic() < deadline, f"{seen - before:g} of {n} requests counted after 5 s"
            time.sleep(0.05)
        totals = {seen, *(_total(get(url + "/metrics").text, unique_name) for _ in range(6))}
        assert totals == {before + n}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
