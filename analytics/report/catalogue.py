"""The metric catalogue: built-in LLM engagement metrics and user definitions.

A metric is declarative: its ``kind`` says how per-unit values are formed from the
per-unit rollups (``unit_rollups``), and its numerator/denominator are small arithmetic
expressions over rollup columns — never SQL from users. Expressions are parsed with
``ast`` and only these forms are accepted: a rollup column name (see
``contracts.tables.ROLLUP_MEASURES``), ``counters['kind']`` (per-unit sum of a custom
feedback kind) or ``counters['kind:n']`` (its count), numeric constants, ``+ - * /`` and
parentheses. ``expression_sql`` renders a validated expression for one table alias.

Expressions are bounded so that neither their parsing nor their SQL can blow up: at most
1000 characters, ``MAX_NODES`` elements nested at most ``MAX_DEPTH`` deep, and constants
finite, 0 or between ``MIN_CONSTANT`` and ``MAX_CONSTANT`` in magnitude (``1e999``
would render as SQL ``inf``, a 400-digit number does not fit a float).

Kinds (x_i is unit i's numerator, y_i its denominator):

- ``proportion``: x_i = 1 if numerator > 0 else 0 (share of units with at least one X);
- ``mean``: x_i = numerator (a per-unit value, e.g. tokens per unit);
- ``ratio``: Σx_i / Σy_i over units (e.g. thumbs-up per response); the statistics engine
  uses the delta method so requests are never treated as independent;
- ``quantile``: the q-quantile of a request-level histogram (``latency`` or ``ttft``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.tables import ROLLUP_MEASURES

Kind = Literal["proportion", "mean", "ratio", "quantile"]
Direction = Literal["higher_is_better", "lower_is_better"]
HistogramName = Literal["latency", "ttft"]

COLUMNS: frozenset[str] = frozenset(ROLLUP_MEASURES)
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,256}$")
_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


MAX_EXPRESSION_LENGTH = 1000
MAX_NODES = 256
MAX_DEPTH = 64
MAX_CONSTANT = 1e12
MIN_CONSTANT = 1e-12


class MetricError(ValueError):
    """A metric definition that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Kind
    numerator: str | None = None
    denominator: str | None = None
    histogram: HistogramName | None = None
    q: float | None = None
    direction: Direction = "higher_is_better"
    guardrail: bool = False
    margin: float = 0.0
    description: str = ""
    unit: str = ""
    builtin: bool = False


# --- expressions --------------------------------------------------------------------------


def _render(node: ast.AST, alias: str, coalesce: bool) -> str:
    if isinstance(node, ast.Expression):
        return _render(node.body, alias, coalesce)
    if isinstance(node, ast.Name):
        if node.id not in COLUMNS:
            raise MetricError(f"unknown column {node.id!r} (known: {', '.join(sorted(COLUMNS))})")
        col = f"{alias}.{node.id}"
        return f"coalesce({col}, 0)" if coalesce else col
    if isinstance(node, ast.Subscript):
        if not (isinstance(node.value, ast.Name) and node.value.id == "counters"):
            raise MetricError("only counters['name'] may be subscripted")
        key = node.slice
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise MetricError("counters[...] needs a quoted name, e.g. counters['my_signal']")
        if not _COUNTER_NAME.match(key.value):
            raise MetricError(f"invalid counter name {key.value!r}")
        return f"coalesce(({alias}.counters ->> '{key.value}')::float8, 0)"
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return repr(float(node.value))  # bounded by _check_bounds: finite, fits a float
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        sign = "-" if isinstance(node.op, ast.USub) else "+"
        return f"({sign}{_render(node.operand, alias, coalesce)})"
    if isinstance(node, ast.BinOp):
        left, right = _render(node.left, alias, coalesce), _render(node.right, alias, coalesce)
        if isinstance(node.op, ast.Add):
            return f"({left} + {right})"
        if isinstance(node.op, ast.Sub):
            return f"({left} - {right})"
        if isinstance(node.op, ast.Mult):
            return f"({left} * {right})"
        if isinstance(node.op, ast.Div):
            # A per-unit quotient with a zero denominator counts as 0 for that unit.
            return f"coalesce({left} / nullif({right}, 0), 0)"
    raise MetricError(
        f"unsupported expression element {type(node).__name__} (allowed: columns, "
        "counters['name'], numbers, + - * /)"
    )


def _check_bounds(tree: ast.Expression) -> None:
    """Size, depth and constants within bounds (walked without recursion)."""
    nodes = 0
    todo: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while todo:
        node, depth = todo.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise MetricError(f"expression has more than {MAX_NODES} elements")
        if depth > MAX_DEPTH:
            raise MetricError(f"expression nested deeper than {MAX_DEPTH} levels")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            v = node.value
            if isinstance(v, float) and not math.isfinite(v):
                raise MetricError(f"number {v} is not finite")
            if abs(v) > MAX_CONSTANT or (v != 0 and abs(v) < MIN_CONSTANT):
                shown = f"{v:.3g}" if isinstance(v, float) else f"{str(v)[:12]}… ({len(str(abs(v)))} digits)"
                raise MetricError(
                    f"number {shown} out of range: constants are 0 or between {MIN_CONSTANT:g} and"
                    f" {MAX_CONSTANT:g} in magnitude"
                )
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _parse(expr: str) -> ast.Expression:
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise MetricError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    if "\x00" in expr:
        raise MetricError("expression contains a NUL character")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise MetricError(f"invalid expression {expr[:80]!r}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):  # the parser's own nesting limits
        raise MetricError(f"expression nested deeper than {MAX_DEPTH} levels") from None
    _check_bounds(tree)
    return tree


def validate_expression(expr: str) -> None:
    _render(_parse(expr), "r", False)


def expression_sql(expr: str, alias: str, *, coalesce: bool = False) -> str:
    """SQL for a validated expression over table ``alias`` (``coalesce`` for outer joins)."""
    return _render(_parse(expr), alias, coalesce)


def columns_of(expr: str) -> set[str]:
    return {n.id for n in ast.walk(_parse(expr)) if isinstance(n, ast.Name) and n.id in COLUMNS}


# --- definitions at the boundary (YAML, admin API) ---------------------------------------


class MetricSpec(BaseModel):
    """A user metric as written in YAML or posted to the API."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Kind
    numerator: str | None = None
    denominator: str | None = None
    histogram: HistogramName | None = None
    q: float | None = Field(default=None, gt=0, lt=1)
    direction: Direction = "higher_is_better"
    guardrail: bool = False
    margin: float = Field(default=0.0, ge=0, lt=1)
    description: str = Field(default="", max_length=1000)
    unit: str = Field(default="", max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        # PostgreSQL's jsonb, where definitions are stored, cannot hold a NUL character.
        if isinstance(data, dict) and any(isinstance(v, str) and "\x00" in v for v in data.values()):
            raise ValueError("text fields must not contain NUL characters")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> MetricSpec:
        if not _METRIC_NAME.match(self.name):
            raise ValueError("name must be lower_snake_case, start with a letter, at most 64 characters")
        if self.kind == "quantile":
            if self.histogram is None or self.q is None:
                raise ValueError("a quantile metric needs 'histogram' (latency|ttft) and 'q' in (0, 1)")
            if self.numerator or self.denominator:
                raise ValueError("a quantile metric takes no numerator/denominator")
            return self
        if not self.numerator:
            raise ValueError(f"a {self.kind} metric needs a numerator")
        if self.kind == "ratio" and not self.denominator:
            raise ValueError("a ratio metric needs a denominator")
        if self.kind != "ratio" and self.denominator:
            raise ValueError(f"a {self.kind} metric takes no denominator (use kind: ratio)")
        if self.histogram is not None or self.q is not None:
            raise ValueError("'histogram' and 'q' apply to quantile metrics only")
        for expr in (self.numerator, self.denominator):
            if expr:
                try:
                    validate_expression(expr)
                except MetricError as exc:
                    raise ValueError(str(exc)) from None
        return self

    def to_metric(self) -> Metric:
        return Metric(**self.model_dump(), builtin=False)


def parse_spec(data: Any) -> Metric:
    """Validate one definition (dict); raise MetricError with the reasons."""
    try:
        spec = MetricSpec.model_validate(data)
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'definition'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise MetricError(reasons) from None
    if spec.name in BUILTINS:
        raise MetricError(f"name {spec.name!r} is a built-in metric")
    return spec.to_metric()


def load_metrics_yaml(path: str | Path) -> list[Metric]:
    """Read user metrics from YAML: a list of definitions, or ``{metrics: [...]}``."""
    doc = yaml.safe_load(Path(path).read_text())
    items = doc.get("metrics") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise MetricError(f"{path}: expected a list of metrics (or a 'metrics:' key)")
    out: list[Metric] = []
    for i, item in enumerate(items):
        try:
            out.append(parse_spec(item))
        except MetricError as exc:
            name = item.get("name") if isinstance(item, dict) else None
            raise MetricError(f"{path}: metric #{i + 1} ({name or '?'}): {exc}") from None
    names = [m.name for m in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise MetricError(f"{path}: duplicate metric names {sorted(dupes)}")
    return out


def spec_dict(metric: Metric) -> dict[str, Any]:
    """The API/YAML form of a metric (what ``metric_definitions.definition`` stores)."""
    return {
        "name": metric.name,
        "kind": metric.kind,
        "numerator": metric.numerator,
        "denominator": metric.denominator,
        "histogram": metric.histogram,
        "q": metric.q,
        "direction": metric.direction,
        "guardrail": metric.guardrail,
        "margin": metric.margin,
        "description": metric.description,
        "unit": metric.unit,
    }


# --- built-ins -----------------------------------------------------------------------------


def _ratio(
    name: str,
    num: str,
    den: str,
    direction: Direction,
    desc: str,
    unit: str = "per response",
    guardrail: bool = False,
    margin: float = 0.0,
) -> Metric:
    return Metric(
        name,
        "ratio",
        num,
        den,
        direction=direction,
        guardrail=guardrail,
        margin=margin,
        description=desc,
        unit=unit,
        builtin=True,
    )


_BUILTIN_LIST: tuple[Metric, ...] = (
    _ratio("thumbs_up_rate", "thumbs_up", "requests", "higher_is_better", "Thumbs-up per response"),
    _ratio(
        "thumbs_down_rate",
        "thumbs_down",
        "requests",
        "lower_is_better",
        "Thumbs-down per response",
        guardrail=True,
        margin=0.10,
    ),
    _ratio("regenerate_rate", "regenerates", "requests", "lower_is_better", "Regenerations per response"),
    _ratio("copy_rate", "copies", "requests", "higher_is_better", "Copies per response"),
    _ratio("mean_rating", "ratings_sum", "ratings_n", "higher_is_better", "Mean rating", unit="rating"),
    _ratio(
        "task_success",
        "task_success_sum",
        "task_success_n",
        "higher_is_better",
        "Mean task-success signal over responses that reported one",
        unit="share",
    ),
    _ratio(
        "continuation_rate",
        "continued",
        "requests",
        "higher_is_better",
        "Responses after which the user continued the conversation",
    ),
    Metric(
        "thumbs_up_units",
        "proportion",
        "thumbs_up",
        direction="higher_is_better",
        description="Share of units that gave at least one thumbs-up",
        unit="share of units",
        builtin=True,
    ),
    Metric(
        "turns_per_unit",
        "mean",
        "turns",
        direction="higher_is_better",
        description="Turns (primary responses) per unit",
        unit="turns",
        builtin=True,
    ),
    _ratio(
        "turns_per_conversation",
        "turns",
        "conversations",
        "higher_is_better",
        "Turns per conversation",
        unit="turns",
    ),
    _ratio(
        "error_rate",
        # Intention to treat: a candidate failure rescued by the control fallback is still
        # the assigned variant failing (the user saw no error, but the candidate is broken).
        "errors + fallbacks",
        "requests",
        "lower_is_better",
        "Requests whose assigned variant failed (errors seen by the user + failures rescued by fallback)",
        unit="per request",
        guardrail=True,
        margin=0.25,
    ),
    _ratio(
        "fallback_rate",
        "fallbacks",
        "requests",
        "lower_is_better",
        "Requests answered by the control after the candidate failed",
        unit="per request",
    ),
    _ratio(
        "latency_mean", "latency_sum", "requests", "lower_is_better", "Mean latency per request", unit="ms"
    ),
    _ratio("ttft_mean", "ttft_sum", "ttft_n", "lower_is_better", "Mean time to first token", unit="ms"),
    Metric(
        "latency_p50",
        "quantile",
        histogram="latency",
        q=0.5,
        direction="lower_is_better",
        description="Median request latency",
        unit="ms",
        builtin=True,
    ),
    Metric(
        "latency_p95",
        "quantile",
        histogram="latency",
        q=0.95,
        direction="lower_is_better",
        guardrail=True,
        margin=0.10,
        description="95th percentile request latency",
        unit="ms",
        builtin=True,
    ),
    Metric(
        "ttft_p95",
        "quantile",
        histogram="ttft",
        q=0.95,
        direction="lower_is_better",
        description="95th percentile time to first token (streamed requests)",
        unit="ms",
        builtin=True,
    ),
    _ratio(
        "completion_tokens_per_response",
        "completion_tokens",
        "requests",
        "lower_is_better",
        "Completion tokens per response (verbosity)",
        unit="tokens",
        guardrail=True,
        margin=0.25,
    ),
    Metric(
        "tokens_per_unit",
        "mean",
        "prompt_tokens + completion_tokens",
        direction="lower_is_better",
        description="Prompt + completion tokens per unit (cost)",
        unit="tokens",
        builtin=True,
    ),
)

BUILTINS: dict[str, Metric] = {m.name: m for m in _BUILTIN_LIST}

#: What the report shows when an experiment names no metrics.
DEFAULT_METRICS: tuple[str, ...] = tuple(BUILTINS)
