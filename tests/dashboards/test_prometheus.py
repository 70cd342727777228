"""Every query of the provisioned Grafana dashboards parses in a real Prometheus and returns
series, with Prometheus scraping a real gateway (traffic to A/B, shadow and rollout routes
through the model simulator) and a real analytics service."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import time
from typing import Any

from tests.dashboards.conftest import Stack, send_traffic
from tests.services import READ_TOKEN, ROOT, http

DASHBOARDS = sorted((ROOT / "dashboards" / "grafana" / "dashboards").glob("*.json"))
# Grafana's variables as a user with "All" selected would see them.
VARIABLES = {"$__rate_interval": "30s", "$__interval": "5s", "$route": ".*", "${datasource}": "prometheus"}


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def grafana_expr(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def wait_for(stack: Stack, expr: str, deadline_s: float) -> list[Any]:
    end = time.monotonic() + deadline_s
    result: list[Any] = []
    while time.monotonic() < end:
        doc = stack.query(expr)
        result = doc.get("data", {}).get("result", [])
        if result:
            return result
        time.sleep(0.5)
    return result


def test_prometheus_config_is_valid() -> None:
    res = subprocess.run(
        ["promtool", "check", "config", str(ROOT / "dashboards" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboards_are_provisioned_from_the_committed_json() -> None:
    import yaml

    provider = yaml.safe_load((ROOT / "dashboards/grafana/provisioning/dashboards/liftgate.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasource = yaml.safe_load(
        (ROOT / "dashboards/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    uids = {d["uid"] for d in datasource["datasources"]}
    titles = set()
    for path in DASHBOARDS:
        doc = json.loads(path.read_text())
        titles.add(doc["title"])
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for var in doc["templating"]["list"]:
            if var["type"] == "datasource":
                assert var["current"]["value"] in uids
    assert {"liftgate · gateway", "liftgate · analytics"} <= titles


def test_every_dashboard_query_parses_and_returns_series(stack: Stack) -> None:
    # Traffic over several scrapes, so rates and histogram quantiles have two samples.
    sent = 0
    end = time.monotonic() + 8
    rounds = 0
    while time.monotonic() < end and rounds < 40:
        sent += send_traffic(stack.gateway, stack.routes, rounds=3, offset=rounds * 3)
        rounds += 1
    assert sent > 0
    for route in stack.routes:
        auth = {"Authorization": f"Bearer {READ_TOKEN}"}
        status, _ = http("GET", f"{stack.analytics}/api/experiments/{route}/report", auth, timeout=60)
        assert status == 200
    assert wait_for(stack, 'up{job="liftgate-gateway"} == 1', 20)
    assert wait_for(stack, 'up{job="liftgate-analytics"} == 1', 20)
    # Both services scraped after the traffic (rates need the later samples).
    assert wait_for(stack, f'sum(liftgate_gateway_requests_total{{route="{stack.routes[0]}"}}) > 0', 20)
    time.sleep(0)  # no fixed wait: the polls above are the readiness conditions

    empty: list[str] = []
    for name, title, expr in dashboard_queries():
        query = grafana_expr(expr)
        doc = stack.query(query)
        assert doc["http_status"] == 200 and doc["status"] == "success", f"{name} / {title}: {query}: {doc}"
        if not doc["data"]["result"] and not wait_for(stack, query, 15):
            empty.append(f"{name} / {title}: {query}")
    assert empty == [], "panels without series:\n" + "\n".join(empty)


def test_rollout_stage_gauge_reports_the_candidates_percent(stack: Stack) -> None:
    rollout = stack.routes[2]
    result = wait_for(stack, f'liftgate_rollout_stage_percent{{route="{rollout}"}}', 30)
    assert result, "the rollout controller exported no stage gauge"
    assert float(result[0]["value"][1]) == 5.0
    assert re.fullmatch(r"prom-rollout-\w+", result[0]["metric"]["experiment"])


def test_committed_dashboards_match_their_generator() -> None:
    generated = runpy.run_path(str(ROOT / "dashboards" / "generate.py"))["DASHBOARDS"]
    assert sorted(generated) == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert json.loads(path.read_text()) == generated[path.name], (
            f"rerun dashboards/generate.py ({path.name})"
        )
