"""No configured secret reaches a log: the gateway and the analytics service as real processes
with known secrets (admin and read tokens, upstream API keys, a database password), errors
triggered on purpose — the admin PATCH that fails in the database among them — and every
byte they logged searched for the secrets."""

from __future__ import annotations

import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.analytics.service.test_api_hardening import call
from tests.known_secrets import leaks, secret
from tests.services import child, free_port, service_env


@contextmanager
def service(module: str, env: dict[str, str], log: Path, ready: str) -> Iterator[None]:
    with child([sys.executable, "-m", module], service_env() | env, ready, log=log):
        yield


def test_neither_service_logs_a_secret_whatever_fails(database_url: str, tmp_path: Path) -> None:
    admin, read, key, new_key, password = (
        secret("admin"), secret("read"), secret("sk-upstream"), secret("sk-new"), secret("pw")
    )  # fmt: skip
    parts = urllib.parse.urlsplit(database_url)
    # Trust authentication ignores the password, but every service holds it in its settings.
    url = parts._replace(netloc=f"{parts.username}:{password}@{parts.hostname}:{parts.port}").geturl()
    gw_port, an_port = free_port(), free_port()
    gw, an = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{an_port}"
    common = {"LIFTGATE_DATABASE_URL": url, "LIFTGATE_ADMIN_TOKEN": admin, "LIFTGATE_LOG_LEVEL": "debug"}
    gw_env = common | {"LIFTGATE_PORT": str(gw_port), "LIFTGATE_SPOOL_DIR": str(tmp_path / "spool")}
    an_env = common | {"LIFTGATE_ANALYTICS_PORT": str(an_port), "LIFTGATE_READ_TOKEN": read,
                       "LIFTGATE_SNAPSHOT_INTERVAL_S": "0.5"}  # fmt: skip
    logs = {"gateway": tmp_path / "gateway.log", "analytics": tmp_path / "analytics.log"}
    statuses: dict[str, int] = {}
    with (
        service("gateway", gw_env, logs["gateway"], f"{gw}/healthz"),
        service("analytics", an_env, logs["analytics"], f"{an}/healthz"),
    ):
        name = "up-" + secret("n")[-8:]
        up = {"name": name, "base_url": "http://127.0.0.1:9/v1", "api_key": key}
        status, _, body = call(gw, "POST", "/admin/upstreams", admin, up)
        assert status == 201, body
        # The reproduction: explicit nulls fail in the database, with the key in the
        # bound parameters and in PostgreSQL's "failing row".
        patch = {"api_key": new_key, "timeout_s": None, "connect_timeout_s": None}
        statuses["patch"] = call(gw, "PATCH", f"/admin/upstreams/{name}", admin, patch)[0]
        # A route on that upstream: the gateway calls it with the key (and fails to connect).
        exp = {"name": name, "route": name, "mode": "ab", "variants": [
            {"name": "control", "upstream": name, "model": "m", "weight": 100, "is_control": True},
            {"name": "cand", "upstream": name, "model": "m", "weight": 0}]}  # fmt: skip
        status, _, body = call(gw, "POST", "/admin/experiments", admin, exp)
        assert status == 201, body
        assert call(gw, "POST", f"/admin/experiments/{name}/start", admin)[0] == 200
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            statuses["chat"] = call(gw, "POST", "/v1/chat/completions", None, chat)[0]
            if statuses["chat"] != 404:
                break
            time.sleep(0.2)
        # Tokens in the wrong places: each one is refused, none is written down.
        for token in (read, key, password):
            assert call(gw, "GET", "/admin/upstreams", token)[0] == 403
            assert call(an, "POST", "/api/metrics", token, {"x": 1})[0] == 403
        assert call(an, "GET", f"/api/experiments/{name}/report?fresh=true", read)[0] == 403
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for token in (admin, key):
            call(
                an, "POST", "/dashboard/login", None, urllib.parse.urlencode({"token": token}).encode(), form
            )
        bad_metric = {"name": "m", "kind": "mean", "numerator": "requests", "description": password, "q": 2}
        assert call(an, "POST", "/api/metrics", admin, bad_metric)[0] == 422
        assert call(an, "GET", f"/api/experiments/{name}/report", read)[0] == 200
    found: dict[str, Any] = {}
    for what, path in logs.items():
        text = path.read_text(errors="replace")
        assert text.strip(), f"{what} logged nothing"
        if leaks(text):
            found[what] = [line for line in text.splitlines() if leaks(line)][:5]
    assert found == {}, f"secrets in logs (statuses {statuses}): {found}"
    gateway_log = logs["gateway"].read_text(errors="replace")
    if statuses["patch"] >= 500:  # the error was logged: scrubbed, not dropped
        assert "IntegrityError" in gateway_log or "NotNullViolation" in gateway_log, gateway_log[-3000:]
