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
        deadline = time.monotonic() + 5
        while post(url + "/v1/chat/completions", body).status_code != 200:  # both workers refreshed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        before = _total(get(url + "/metrics").text, unique_name)
        n = 40
        for i in range(n):  # one connection per request: the kernel spreads them over both workers
            assert post(url + "/v1/chat/completions", {**body, "user": f"u{i}"}).status_code == 200
        totals = {_total(get(url + "/metrics").text, unique_name) for _ in range(6)}
        assert totals == {before + n}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
