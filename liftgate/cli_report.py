"""``liftgate report EXPERIMENT``: an experiment's report from the analytics API, as a table."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from analytics.report.schema import Interval, Report, VariantResult
from liftgate.admin_client import AdminError, resolve_analytics_url, resolve_read_token, resolve_token

_VERDICT_STYLE = {"ship": "bold green", "harm": "bold red", "srm": "bold red", "no_difference_yet": "yellow",
                  "insufficient_data": "dim"}  # fmt: skip


def fetch_report(
    url: str, experiment: str, fresh: bool, token: str = "", timeout_s: float = 30.0
) -> dict[str, Any]:
    """The report JSON; ``token``: a read token (the admin token for ``fresh``)."""
    path = f"/api/experiments/{urllib.parse.quote(experiment, safe='')}/report"
    full = url.rstrip("/") + path + ("?fresh=1" if fresh else "")
    req = urllib.request.Request(full, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail", exc.reason)
        except ValueError:
            detail = exc.reason
        raise ReportError(f"{exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise ReportError(f"cannot reach the analytics service at {url}: {exc}") from None


class ReportError(RuntimeError):
    pass


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1%}"


def _num(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def _ci(ci: Interval | None, relative: bool) -> str:
    if ci is None:
        return "—"
    f = _pct if relative else _num
    return f"[{f(ci.lower)}, {f(ci.upper)}]"


def _p(v: float | None) -> str:
    return "—" if v is None else ("<0.001" if v < 0.001 else f"{v:.3f}")


def _status(r: VariantResult) -> str:
    if r.error is not None and r.lift_absolute is None:
        return f"[dim]{r.error.code}[/]"
    parts = []
    if r.significant:
        parts.append("[green]better[/]" if r.better else "[red]worse[/]")
    if r.error is not None and r.error.code == "insufficient_data":
        parts.append("[dim]insufficient data[/]")
    g = r.guardrail
    if g is not None and g.error is not None and g.error.code == "not_yet_valid":
        parts.append("[yellow]guardrail fixed-horizon, not yet valid[/]")
    elif g is not None:
        style = {"pass": "green", "fail": "red", "inconclusive": "yellow"}[g.outcome]
        kind = " (fixed-horizon)" if g.test == "fixed_horizon" else ""
        parts.append(f"[{style}]guardrail {g.outcome}{kind}[/]")
    if not parts and r.p_value is not None and r.p_value_sequential is None:
        # No always-valid test (quantiles): the verdict policy cannot call it either way.
        return "[dim]fixed-horizon only[/]"
    return " ".join(parts) or "[dim]n.s.[/]"


def render(report: Report, console: Console) -> None:
    started = report.started_at.strftime("%Y-%m-%d %H:%M") if report.started_at else "—"
    console.print(
        f"[bold]{report.name}[/] (id {report.experiment_id}) route [cyan]{report.route}[/] mode {report.mode} "
        f"status {report.status} · started {started} · {report.units:,} units · generated "
        f"{report.generated_at:%Y-%m-%d %H:%M:%S}"
    )
    srm = report.srm
    per_stage = " per stage" if srm.method == "per_stage" else ""
    if srm.flagged:
        bad = ", ".join(f"{s.percent:g}%" for s in srm.stages if s.flagged and s.percent is not None)
        where = f" in stage {bad}" if bad else ""
        console.print(
            f"[bold red]SRM: sample ratio mismatch{where} (p={_p(srm.p_value)}) — results are not trustworthy[/]"
        )
    elif srm.p_value is not None:
        console.print(f"SRM: ok{per_stage} (p={_p(srm.p_value)})")
    else:
        console.print(f"SRM: {srm.error.message if srm.error else 'n/a'}")
    split = ", ".join(
        f"{a.variant} {a.observed_units:,} ({_pct(a.observed_share).lstrip('+')} vs {a.expected_share:.0%})"
        for a in report.allocation
    )
    console.print(f"allocation: {split}")
    table = Table(show_lines=False, header_style="bold")
    for col in (
        "metric",
        "variant",
        "units",
        "mean",
        "lift",
        "95% CI",
        "seq. CI",
        "p",
        "p (Holm, seq)",
        "verdict",
    ):
        table.add_column(col, justify="right" if col not in ("metric", "variant", "verdict") else "left")
    info = {m.name: m for m in report.metrics}
    for r in report.results:
        m = info.get(r.metric)
        name = r.metric + (" [magenta]◆[/]" if m and m.guardrail else "")
        if r.is_control:
            table.add_row(
                name, f"{r.variant} (control)", f"{r.units:,}", _num(r.mean), "", "", "", "", "", ""
            )
            continue
        table.add_row(
            name, r.variant, f"{r.units:,}", _num(r.mean), _pct(r.lift_relative), _ci(r.ci_relative, True),
            _ci(r.sequential_ci_relative, True), _p(r.p_value), _p(r.p_sequential_holm), _status(r),
        )  # fmt: skip
    console.print(table)
    console.print("[dim]◆ guardrail · lift relative to control · verdicts use Holm-corrected sequential p[/]")
    _render_paired(report, console)
    _render_segments(report, console)
    for v in report.verdicts:
        style = _VERDICT_STYLE.get(v.verdict, "")
        console.print(f"verdict [bold]{v.variant}[/]: [{style}]{v.verdict}[/] — {v.reason}")
        if v.basis:
            console.print(f"  [dim]on {v.basis}[/]")
        for d in v.differences:
            console.print(f"  [yellow]≠[/] {d}")
    for e in report.errors:
        console.print(f"[yellow]note[/] {e.code}: {e.message}")


def _render_paired(report: Report, console: Console) -> None:
    for pc in report.paired:
        table = Table(
            title=f"shadow pairs: {pc.variant} vs {pc.baseline} ({pc.pairs:,} pairs)", header_style="bold"
        )
        for col in ("measure", "baseline", "candidate", "difference", "95% CI", "p"):
            table.add_column(col, justify="left" if col == "measure" else "right")
        for m in pc.metrics:
            table.add_row(m.name, _num(m.baseline_mean), _num(m.candidate_mean), _num(m.mean_difference),
                          _ci(m.ci, False), _p(m.p_value))  # fmt: skip
        console.print(table)
        if pc.agreement is not None:
            console.print(f"agreement {pc.agreement:.1%} ({pc.agreement_basis})")


def _render_segments(report: Report, console: Console) -> None:
    """Only what stands out: segment rows that are significant (corrected across segments)."""
    notable = [(s, r) for s in report.segments for r in s.results if not r.is_control and r.significant]
    if not report.segments:
        return
    if not notable:
        console.print(
            f"segments ({', '.join(s.segment for s in report.segments)}): no significant differences"
        )
        return
    console.print("segments with significant differences (Holm across metrics × variants × segments):")
    for seg, r in notable:
        word = "[green]better[/]" if r.better else "[red]worse[/]"
        console.print(f"  {seg.segment} ({seg.units:,} units): {r.metric} {r.variant} {word} {_pct(r.lift_relative)}"
                      f" {_ci(r.sequential_ci_relative, True)}")  # fmt: skip


def report(
    experiment: str = typer.Argument(..., help="Experiment id or name."),
    as_json: bool = typer.Option(False, "--json", help="Print the report JSON instead of a table."),
    url: str | None = typer.Option(
        None,
        "--url",
        envvar="LIFTGATE_ANALYTICS_URL",
        help="Analytics service URL (default: what a running `liftgate up` recorded, else "
        "http://127.0.0.1:8090).",
    ),
    fresh: bool = typer.Option(
        False, "--fresh", help="Recompute instead of using the latest snapshot (needs the admin token)."
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="Read token (default: LIFTGATE_READ_TOKEN, LIFTGATE_ADMIN_TOKEN, else what `liftgate up` stored);"
        " --fresh needs the admin token.",
    ),
    state_dir: Path = typer.Option(
        Path(".liftgate"),
        "--state-dir",
        envvar="LIFTGATE_STATE_DIR",
        help="Where `liftgate up` keeps its tokens.",
    ),
) -> None:
    """Show an experiment's report: variants × metrics with lift, CI, p-values and verdicts."""
    try:
        credential = resolve_token(token, state_dir) if fresh else resolve_read_token(token, state_dir)
        data = fetch_report(resolve_analytics_url(url, state_dir), experiment, fresh, credential)
    except (ReportError, AdminError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    render(Report.model_validate(data), Console(width=200))
