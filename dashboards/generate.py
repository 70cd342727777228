"""Generate liftgate's Grafana dashboards (JSON) from one short description per panel.

    .venv/bin/python dashboards/generate.py      # rewrites dashboards/grafana/dashboards/*.json

The JSON files are committed (Grafana provisions them as they are); edit this script and
rerun it rather than editing the JSON. Queries use only the metric names documented in
``gateway/telemetry.py``, ``analytics/service/telemetry.py``, ``analytics/ingest/consumer.py`` and
``analytics/rollout/telemetry.py``; ``tests/dashboards`` runs every query against a real
Prometheus scraping a real gateway and analytics service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "grafana" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
ROUTE = 'route=~"$route"'


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | bargauge
    width: int = 12
    height: int = 8
    description: str = ""
    stacked: bool = False
    thresholds: tuple[tuple[float | None, str], ...] = ((None, "green"),)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _q(quantile: float, metric: str, by: str = "route, variant") -> str:
    return (
        f"histogram_quantile({quantile}, sum by (le, {by}) "
        f'(rate({metric}_bucket{{{ROUTE}, role="primary"}}[{RATE}])))'
    )


PRIMARY = f'{ROUTE}, role="primary"'

GATEWAY: tuple[Row, ...] = (
    Row(
        "Traffic",
        (
            Panel(
                "Request rate by variant",
                (
                    Target(
                        f"sum by (route, variant) (rate(liftgate_gateway_requests_total{{{PRIMARY}}}[{RATE}]))",
                        "{{route}} · {{variant}}",
                    ),
                ),
                unit="reqps",
                width=8,
                description="Primary (user-facing) requests per second.",
            ),
            Panel(
                "Traffic split by variant (observed)",
                (
                    Target(
                        f"sum by (route, variant) (rate(liftgate_gateway_requests_total{{{PRIMARY}}}[{RATE}]))"
                        " / on (route) group_left "
                        f"sum by (route) (rate(liftgate_gateway_requests_total{{{PRIMARY}}}[{RATE}]))",
                        "{{route}} · {{variant}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                stacked=True,
                description="Share of each route's primary requests served by each variant.",
            ),
            Panel(
                "Configured weight by variant",
                (
                    Target(
                        f"max by (route, variant) (liftgate_gateway_variant_weight{{{ROUTE}}})",
                        "{{route}} · {{variant}}",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                kind="bargauge",
                width=8,
                description="The split the gateway's config snapshot asks for; compare with the observed split.",
            ),
            Panel(
                "Current rollout stage per route",
                (
                    Target(
                        f"max by (route, experiment) (liftgate_rollout_stage_percent{{{ROUTE}}})",
                        "{{route}} · {{experiment}}",
                        instant=True,
                    ),
                ),
                unit="percent",
                kind="stat",
                width=12,
                description="Candidate traffic percent of each running rollout (rollout controller).",
                thresholds=((None, "blue"),),
            ),
            Panel(
                "Rollout stage index seen by the gateway",
                (
                    Target(
                        f"max by (route, experiment) (liftgate_gateway_rollout_stage{{{ROUTE}}})",
                        "{{route}} · {{experiment}}",
                        instant=True,
                    ),
                ),
                kind="stat",
                width=12,
                description="Stage index in the gateway's config snapshot (applied within 1 s of a decision).",
                thresholds=((None, "blue"),),
            ),
        ),
    ),
    Row(
        "Errors",
        (
            Panel(
                "Error rate by variant (5xx share)",
                (
                    Target(
                        "sum by (route, variant) (rate(liftgate_gateway_requests_total"
                        f'{{{PRIMARY}, status_class="5xx"}}[{RATE}]))'
                        f" / sum by (route, variant) (rate(liftgate_gateway_requests_total{{{PRIMARY}}}[{RATE}]))",
                        "{{route}} · {{variant}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                thresholds=((None, "green"), (0.05, "red")),
            ),
            Panel(
                "Upstream errors by type",
                (
                    Target(
                        "sum by (route, variant, error_type) "
                        f"(rate(liftgate_gateway_upstream_errors_total{{{ROUTE}}}[{RATE}]))",
                        "{{route}} · {{variant}} · {{error_type}}",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Fallbacks to the control",
                (
                    Target(
                        f"sum by (route, variant) (rate(liftgate_gateway_fallbacks_total{{{ROUTE}}}[{RATE}]))",
                        "{{route}} · {{variant}}",
                    ),
                ),
                unit="reqps",
                width=8,
                description="Failed candidate calls retried on the control (per experiment opt-in).",
            ),
        ),
    ),
    Row(
        "Latency",
        (
            Panel(
                "Latency percentiles by variant",
                (
                    Target(
                        _q(0.5, "liftgate_gateway_request_duration_seconds"), "p50 {{route}} · {{variant}}"
                    ),
                    Target(
                        _q(0.95, "liftgate_gateway_request_duration_seconds"), "p95 {{route}} · {{variant}}"
                    ),
                    Target(
                        _q(0.99, "liftgate_gateway_request_duration_seconds"), "p99 {{route}} · {{variant}}"
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Time to first token percentiles by variant (streamed)",
                (
                    Target(_q(0.5, "liftgate_gateway_ttft_seconds"), "p50 {{route}} · {{variant}}"),
                    Target(_q(0.95, "liftgate_gateway_ttft_seconds"), "p95 {{route}} · {{variant}}"),
                ),
                unit="s",
            ),
        ),
    ),
    Row(
        "Shadow and tokens",
        (
            Panel(
                "Shadow calls by outcome",
                (
                    Target(
                        "sum by (route, variant, outcome) "
                        f"(rate(liftgate_gateway_shadow_total{{{ROUTE}}}[{RATE}]))",
                        "{{route}} · {{variant}} · {{outcome}}",
                    ),
                ),
                unit="reqps",
                description="sent: mirrored; dropped: queue full (never waited for); ok / failed: shadow answers.",
            ),
            Panel(
                "Tokens per second by variant",
                (
                    Target(
                        f"sum by (route, variant, kind) (rate(liftgate_gateway_tokens_total{{{ROUTE}}}[{RATE}]))",
                        "{{route}} · {{variant}} · {{kind}}",
                    ),
                ),
                unit="short",
            ),
        ),
    ),
    Row(
        "Event sink",
        (
            Panel(
                "Events emitted by type",
                (
                    Target(
                        f"sum by (type) (rate(liftgate_gateway_events_emitted_total[{RATE}]))",
                        "{{type}}",
                    ),
                ),
                unit="short",
                width=8,
            ),
            Panel(
                "Sink throughput (delivered, spooled, replayed)",
                (
                    Target(
                        "sum by (state) (deriv(liftgate_gateway_sink_events"
                        f'{{state=~"delivered|spooled|replayed"}}[{RATE}]))',
                        "{{state}}",
                    ),
                ),
                unit="short",
                width=8,
                description="Per-second change of the sink's counters (exported as gauges by the gateway).",
            ),
            Panel(
                "Spool size (events waiting for Kafka)",
                (
                    Target('sum(liftgate_gateway_sink_events{state="spool_pending"})', "events"),
                    Target('sum(liftgate_gateway_sink_events{state="queued"})', "in-memory queue"),
                ),
                unit="short",
                width=8,
                thresholds=((None, "green"), (1, "orange")),
            ),
            Panel(
                "Sink healthy (Kafka reachable)",
                (Target('min(liftgate_gateway_sink_events{state="live"})', "live", instant=True),),
                kind="stat",
                width=6,
                thresholds=((None, "red"), (1, "green")),
                extra={
                    "mappings": [
                        {"type": "value", "options": {"0": {"text": "spooling"}, "1": {"text": "live"}}}
                    ]
                },
            ),
            Panel(
                "Events dropped",
                (Target('sum(liftgate_gateway_sink_events{state="dropped"})', "dropped", instant=True),),
                kind="stat",
                width=6,
                thresholds=((None, "green"), (1, "red")),
            ),
            Panel(
                "Config snapshot age",
                (Target("max(liftgate_gateway_config_age_seconds)", "age", instant=True),),
                kind="stat",
                unit="s",
                width=6,
                thresholds=((None, "green"), (2, "orange"), (10, "red")),
                description="Seconds since the gateway last refreshed experiments from the database (target < 1 s).",
            ),
            Panel(
                "Gateway scrape up",
                (Target('sum(up{job="liftgate-gateway"})', "up", instant=True),),
                kind="stat",
                width=6,
                thresholds=((None, "red"), (1, "green")),
            ),
        ),
    ),
)

ANALYTICS: tuple[Row, ...] = (
    Row(
        "Ingest",
        (
            Panel(
                "Events ingested per second",
                (
                    Target(
                        f"sum by (topic) (rate(liftgate_analytics_events_consumed_total[{RATE}]))",
                        "{{topic}}",
                    ),
                ),
                unit="short",
                width=8,
            ),
            Panel(
                "Consumer lag",
                (Target("sum by (topic) (liftgate_analytics_consumer_lag)", "{{topic}}"),),
                unit="short",
                width=8,
                description="Messages behind the end of each topic (summed over partitions).",
                thresholds=((None, "green"), (10000, "orange")),
            ),
            Panel(
                "Dead letters (total)",
                (Target("sum by (topic) (liftgate_analytics_events_dead_lettered_total)", "{{topic}}"),),
                unit="short",
                width=8,
                description="Messages that could not be decoded or ingested (table dead_letters has the raw bytes).",
                thresholds=((None, "green"), (1, "red")),
            ),
            Panel(
                "Redelivered duplicates ignored and database retries",
                (
                    Target(f"sum(rate(liftgate_analytics_events_duplicate_total[{RATE}]))", "duplicates"),
                    Target(f"sum(rate(liftgate_analytics_db_retries_total[{RATE}]))", "db retries"),
                ),
                unit="short",
                description="Duplicates: at-least-once delivery absorbed by idempotent ingest.",
            ),
            Panel(
                "Batch write time (p50, p95)",
                (
                    Target(
                        "histogram_quantile(0.5, sum by (le) "
                        f"(rate(liftgate_analytics_batch_write_seconds_bucket[{RATE}])))",
                        "p50",
                    ),
                    Target(
                        "histogram_quantile(0.95, sum by (le) "
                        f"(rate(liftgate_analytics_batch_write_seconds_bucket[{RATE}])))",
                        "p95",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Background workers up",
                (Target("max by (worker) (liftgate_analytics_worker_up)", "{{worker}}", instant=True),),
                kind="stat",
                thresholds=((None, "red"), (1, "green")),
            ),
        ),
    ),
    Row(
        "Reports",
        (
            Panel(
                "Report build time (p50, p95)",
                (
                    Target(
                        "histogram_quantile(0.5, sum by (le, source) "
                        f"(rate(liftgate_analytics_report_build_seconds_bucket[{RATE}])))",
                        "p50 {{source}}",
                    ),
                    Target(
                        "histogram_quantile(0.95, sum by (le, source) "
                        f"(rate(liftgate_analytics_report_build_seconds_bucket[{RATE}])))",
                        "p95 {{source}}",
                    ),
                ),
                unit="s",
                width=8,
                thresholds=((None, "green"), (1, "red")),
            ),
            Panel(
                "Snapshots by outcome",
                (
                    Target(
                        f"sum by (outcome) (rate(liftgate_analytics_snapshots_total[{RATE}]))",
                        "{{outcome}}",
                    ),
                ),
                unit="short",
                width=8,
            ),
            Panel(
                "Report requests by how they were served",
                (
                    Target(
                        f"sum by (served) (rate(liftgate_analytics_report_requests_total[{RATE}]))",
                        "{{served}}",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
        ),
    ),
    Row(
        "Rollouts",
        (
            Panel(
                "Current rollout stage per route",
                (
                    Target(
                        "max by (route, experiment) (liftgate_rollout_stage_percent)",
                        "{{route}} · {{experiment}}",
                    ),
                ),
                unit="percent",
                description="Candidate traffic percent; 0 after a rollback, 100 after promotion.",
            ),
            Panel(
                "Rollout decisions",
                (
                    Target(
                        f"sum by (decision) (increase(liftgate_rollout_decisions_total[{RATE}]))",
                        "{{decision}}",
                    ),
                    Target(
                        f"sum by (outcome) (increase(liftgate_rollout_evaluations_total[{RATE}]))",
                        "evaluations {{outcome}}",
                    ),
                ),
                unit="short",
            ),
        ),
    ),
)


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    steps = [{"color": color, "value": value} for value, color in panel.thresholds]
    defaults: dict[str, Any] = {"unit": panel.unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 25 if panel.stacked else 8,
            "showPoints": "never",
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
        defaults["color"] = {"mode": "palette-classic"}
    else:
        defaults["color"] = {"mode": "thresholds"}
    defaults.update(panel.extra)
    options: dict[str, Any]
    if panel.kind == "timeseries":
        options = {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
        }
    else:
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
        }
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend,
                "instant": t.instant,
                "range": not t.instant,
            }
            for i, t in enumerate(panel.targets)
        ],
    }


def _variables(with_route: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            # The provisioned data source (grafana/provisioning/datasources/prometheus.yaml).
            "current": {"text": "Prometheus", "value": "prometheus"},
            "hide": 0,
        }
    ]
    if with_route:
        out.append(
            {
                "name": "route",
                "label": "route",
                "type": "query",
                "datasource": DATASOURCE,
                "query": {"query": "label_values(liftgate_gateway_requests_total, route)", "refId": "routes"},
                "definition": "label_values(liftgate_gateway_requests_total, route)",
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"text": "All", "value": "$__all"},
                "refresh": 2,
                "sort": 1,
                "hide": 0,
            }
        )
    return out


def dashboard(uid: str, title: str, rows: tuple[Row, ...], with_route: bool) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid = 1
    y = 0
    for row in rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        x = 0
        line_h = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_h = 0, y + line_h, 0
            panels.append(_panel_json(panel, pid, x, y))
            pid += 1
            x += panel.width
            line_h = max(line_h, panel.height)
        y += line_h
    return {
        "uid": uid,
        "title": title,
        "tags": ["liftgate"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": _variables(with_route)},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


DASHBOARDS = {
    "liftgate-gateway.json": dashboard("liftgate-gateway", "liftgate · gateway", GATEWAY, with_route=True),
    "liftgate-analytics.json": dashboard(
        "liftgate-analytics", "liftgate · analytics", ANALYTICS, with_route=False
    ),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, doc in DASHBOARDS.items():
        (OUT / name).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
