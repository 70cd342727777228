"""The metric catalogue: built-ins, YAML definitions and the safe expression language."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.report.catalogue import (
    BUILTINS,
    MetricError,
    expression_sql,
    load_metrics_yaml,
    parse_spec,
    spec_dict,
)


def test_builtins_cover_the_issue_list_with_directions_and_guardrails() -> None:
    expected = {
        "thumbs_up_rate", "thumbs_down_rate", "regenerate_rate", "copy_rate", "mean_rating", "task_success",
        "continuation_rate", "turns_per_unit", "error_rate", "fallback_rate", "latency_mean", "latency_p50",
        "latency_p95", "ttft_p95", "completion_tokens_per_response", "tokens_per_unit",
    }  # fmt: skip
    assert expected <= set(BUILTINS)
    assert BUILTINS["thumbs_up_rate"].kind == "ratio" and BUILTINS["thumbs_up_rate"].denominator == "requests"
    assert BUILTINS["error_rate"].direction == "lower_is_better" and BUILTINS["error_rate"].guardrail
    assert BUILTINS["latency_p95"].kind == "quantile" and BUILTINS["latency_p95"].q == 0.95
    assert {m for m, d in BUILTINS.items() if d.guardrail} >= {
        "error_rate", "latency_p95", "thumbs_down_rate", "completion_tokens_per_response",
    }  # fmt: skip


def test_yaml_definitions_load_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "metrics.yaml"
    path.write_text(
        """
metrics:
  - name: helpful_per_response
    kind: ratio
    numerator: counters['helpful']
    denominator: requests
    direction: higher_is_better
    guardrail: true
    margin: 0.05
  - name: latency_p99
    kind: quantile
    histogram: latency
    q: 0.99
    direction: lower_is_better
"""
    )
    metrics = load_metrics_yaml(path)
    assert [m.name for m in metrics] == ["helpful_per_response", "latency_p99"]
    assert metrics[0].guardrail and metrics[0].margin == 0.05
    assert parse_spec(spec_dict(metrics[0])) == metrics[0]


def _balanced(levels: int) -> str:
    """A sum of 2**levels negated constants as a balanced tree: many nodes, shallow, short."""
    return "-1" if levels == 0 else f"({_balanced(levels - 1)}+{_balanced(levels - 1)})"


@pytest.mark.parametrize(
    ("definition", "reason"),
    [
        (
            {"name": "x", "kind": "ratio", "numerator": "thumbs_upp", "denominator": "requests"},
            "unknown column 'thumbs_upp'",
        ),
        ({"name": "x", "kind": "median", "numerator": "requests"}, "kind"),
        ({"name": "x", "kind": "ratio", "numerator": "requests"}, "needs a denominator"),
        (
            {"name": "x", "kind": "mean", "numerator": "requests; DROP TABLE interactions"},
            "invalid expression",
        ),
        (
            {"name": "x", "kind": "mean", "numerator": "__import__('os').system('id')"},
            "unsupported expression",
        ),
        ({"name": "x", "kind": "mean", "numerator": "requests.real"}, "unsupported expression"),
        ({"name": "x", "kind": "mean", "numerator": 'counters["a\'; --"]'}, "invalid counter name"),
        ({"name": "x", "kind": "mean", "numerator": "requests ** 2"}, "unsupported expression"),
        ({"name": "x", "kind": "quantile", "histogram": "latency"}, "needs 'histogram'"),
        ({"name": "Bad Name", "kind": "mean", "numerator": "requests"}, "lower_snake_case"),
        ({"name": "error_rate", "kind": "mean", "numerator": "errors"}, "built-in"),
        ({"name": "x", "kind": "mean", "numerator": "errors", "sql": "1"}, "sql"),
        # Bounded: numbers finite and within range, expressions of bounded size and depth.
        ({"name": "x", "kind": "mean", "numerator": "requests * 1e999"}, "number inf is not finite"),
        ({"name": "x", "kind": "mean", "numerator": "requests * " + "9" * 400}, "(400 digits) out of range"),
        ({"name": "x", "kind": "mean", "numerator": "requests / 1e-300"}, "out of range"),
        ({"name": "x", "kind": "mean", "numerator": "-" * 990 + "requests"}, "nested deeper than 64 levels"),
        ({"name": "x", "kind": "mean", "numerator": _balanced(7)}, "more than 256 elements"),
        ({"name": "x", "kind": "mean", "numerator": "requests" + "\x00"}, "NUL"),
        ({"name": "x", "kind": "mean", "numerator": "requests", "description": "a\x00b"}, "NUL"),
        ({"name": "x", "kind": "mean", "numerator": "requests", "unit": "u" * 65}, "unit"),
        ({"name": "x", "kind": "mean", "numerator": "requests", "margin": float("nan")}, "margin"),
    ],
)
def test_invalid_definitions_are_refused_with_a_clear_reason(
    definition: dict[str, object], reason: str
) -> None:
    with pytest.raises(MetricError, match=None) as info:
        parse_spec(definition)
    assert reason in str(info.value)


def test_yaml_errors_name_the_metric(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "- {name: ok_metric, kind: mean, numerator: requests}\n- {name: broken, kind: mean, numerator: nope}\n"
    )
    with pytest.raises(MetricError, match=r"metric #2 \(broken\): .*unknown column 'nope'"):
        load_metrics_yaml(path)


def test_expressions_render_to_sql_over_whitelisted_columns_only() -> None:
    sql = expression_sql("(thumbs_up - thumbs_down) / requests + counters['my.sig']", "r")
    assert sql == (
        "(coalesce((r.thumbs_up - r.thumbs_down) / nullif(r.requests, 0), 0)"
        " + coalesce((r.counters ->> 'my.sig')::float8, 0))"
    )
