"""``liftgate rollout status|advance|pause|resume|rollback EXPERIMENT`` and ``liftgate rollout
check FILE`` (the analytics service: its API for reads, its ``/admin`` — the one admin base
URL — for the actions).

Mutating commands need the admin token (``--token``, ``LIFTGATE_ADMIN_TOKEN`` or the
file ``liftgate up`` wrote) and are recorded as rollout decisions with the actor
``admin:<--actor>`` (default: the local user name) and in the audit log. ``check`` asks the
service to check the rollout plans in an experiment (or plan) file: errors, warnings and
the harm each stage can detect at the route's traffic.
"""

from __future__ import annotations

import getpass
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from liftgate.admin_client import (
    AdminClient,
    AdminError,
    resolve_admin_url,
    resolve_analytics_url,
    resolve_read_token,
    resolve_token,
)
from liftgate.experiment_file import load_experiment_file

app = typer.Typer(help="Staged rollouts: status and manual control.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)

AnalyticsOpt = Annotated[
    str | None,
    typer.Option(
        "--analytics",
        envvar="LIFTGATE_ANALYTICS_URL",
        help="Analytics service base URL (default: what a running `liftgate up` recorded, else "
        "http://127.0.0.1:8090).",
    ),
]
AdminOpt = Annotated[
    str | None,
    typer.Option(
        "--analytics",
        "--admin-url",
        envvar=["LIFTGATE_ADMIN_URL", "LIFTGATE_ANALYTICS_URL"],
        help="The analytics service, the admin base URL (default: what `liftgate up` recorded, else "
        "http://127.0.0.1:8090).",
    ),
]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="LIFTGATE_ADMIN_TOKEN", help="Admin token.")]
StateOpt = Annotated[
    Path,
    typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON.")]
ActorOpt = Annotated[str | None, typer.Option("--actor", help="Operator name for the decision record.")]
Experiment = Annotated[str, typer.Argument(help="Experiment id or name.")]


class _Client(AdminClient):
    def __init__(self, base_url: str, token: str, actor: str | None) -> None:
        super().__init__(base_url, token)
        self.actor = actor

    def rollout(self, experiment: str, action: str | None = None) -> dict[str, Any]:
        quoted = urllib.parse.quote(experiment, safe="")
        if action is None:
            result: dict[str, Any] = self.request("GET", f"/api/experiments/{quoted}/rollout")
            return result
        return self._post(f"/admin/experiments/{quoted}/rollout/{action}")

    def _post(self, path: str) -> dict[str, Any]:

        req = urllib.request.Request(
            self.base_url + path,
            data=b"",
            method="POST",
            headers={"Authorization": f"Bearer {self._token}", "X-Liftgate-Actor": self.actor or ""},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                data: dict[str, Any] = json.loads(resp.read())
                return data
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail", exc.reason)
            except ValueError:
                detail = exc.reason
            raise AdminError(exc.code, f"POST {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(0, f"POST {path}: cannot reach {self.base_url} ({exc})") from None


def stage_text(percent: float | None, index: int | None, count: int) -> str:
    """A stage as people read it: the candidate's share, then where it is in the plan."""
    if index is None:
        return "—"
    where = f" ({index + 1} of {count})" if count else ""
    return ("—" if percent is None else f"{percent:g}%") + where


def render(state: dict[str, Any]) -> None:
    pct = state.get("stage_percent")
    console.print(
        f"[bold]{state['name']}[/] (route {state['route']}): status [bold]{state['status']}[/], "
        f"stage {stage_text(pct, state.get('stage'), len(state.get('stages') or []))}, "
        f"stage started {state.get('stage_started_at') or '—'}"
    )
    if state.get("status_reason"):
        console.print(f"reason: {state['status_reason']}")
    if state.get("plan_error"):
        err.print(f"[red]invalid plan:[/] {state['plan_error']}")
    weights = ", ".join(
        f"{v['name']}{' (control)' if v['is_control'] else ''} {v['weight']:g}"
        for v in state.get("variants", [])
    )
    console.print(f"weights: {weights}")
    table = Table("time", "stage", "decision", "reason", "by")
    stages = [s["percent"] for s in state.get("stages", [])]

    def label(i: int | None) -> str:
        if i is None:
            return "—"
        return f"{stages[i]:g}%" if i < len(stages) else str(i)

    for d in state.get("decisions", [])[-30:]:
        moved = d["to_stage"] is not None and d["to_stage"] != d["stage"]
        where = f"{label(d['stage'])} → {label(d['to_stage'])}" if moved else label(d["stage"])
        table.add_row(d["created_at"][:19], where, d["decision"], d["reason"], d["actor"])
    console.print(table)


def _run(analytics: str | None, token: str | None, state_dir: Path, actor: str | None, experiment: str,
         action: str | None, as_json: bool) -> None:  # fmt: skip
    try:
        tok = resolve_token(token, state_dir) if action is not None else resolve_read_token(token, state_dir)
        client = _Client(resolve_admin_url(analytics, state_dir), tok, actor or getpass.getuser())
        state = client.rollout(experiment, action)
    except AdminError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(state, indent=2))
    else:
        render(state)


@app.command()
def status(experiment: Experiment, analytics: AdminOpt = None, token: TokenOpt = None,
           state_dir: StateOpt = Path(".liftgate"), as_json: JsonOpt = False) -> None:  # fmt: skip
    """Current stage, weights and the decision timeline."""
    _run(analytics, token, state_dir, None, experiment, None, as_json)


def _action(name: str, doc: str) -> None:
    def command(experiment: Experiment, analytics: AdminOpt = None, token: TokenOpt = None,
                state_dir: StateOpt = Path(".liftgate"), actor: ActorOpt = None, as_json: JsonOpt = False) -> None:  # fmt: skip
        _run(analytics, token, state_dir, actor, experiment, name, as_json)

    command.__doc__ = doc
    app.command(name)(command)


_action("advance", "Go to the next stage now, ignoring the stage's minimums (promote at the last stage).")
_action("pause", "Pause: the controller stops acting and the gateway serves the control to everyone.")
_action("resume", "Resume a paused rollout at its stage (the stage clock restarts).")
_action("rollback", "Roll back: candidate to 0%, status rolled_back.")


def check_remote(analytics: str, plan: Any, route: str | None, token: str | None = None) -> dict[str, Any]:
    """The analytics service's plan check (``POST /api/rollout-plans/check``; a read credential)."""
    result: dict[str, Any] = AdminClient(analytics, resolve_read_token(token)).request(
        "POST", "/api/rollout-plans/check", {"plan": plan, "route": route}
    )
    return result


def _num(v: Any, scale: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:+.1%}" if scale == "relative" else f"{v:+.4g}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:g}%"


def render_check(title: str, result: dict[str, Any], *, table: bool = True) -> None:
    """Errors (refused), warnings (accepted), and the detectable harm per guardrail per stage."""
    verdict = "[red]refused[/]" if result["errors"] else "[green]ok[/]"
    console.print(
        f"[bold]{title}[/]: plan {verdict}, promotion decided at the {_pct(result.get('promotion_percent'))} stage"
    )
    for e in result["errors"]:
        err.print(f"[red]error:[/] {e}")
    for w in result["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
    seq = result.get("sequential")
    if isinstance(seq, dict) and seq.get("mode") == "group":
        looks = ", ".join(
            f"{r['units']} units α {r['adjusted_alpha']:.2g}" for r in seq.get("planned_looks") or ()
        )
        console.print(
            f"group-sequential ({seq['spending']}, {seq['looks']} looks per stage, one-sided α "
            f"{seq['alpha_per_stage']:.3g} per stage): {looks}"
        )
    traffic = result.get("traffic")
    if not table or not result.get("mde") or not isinstance(traffic, dict):
        return
    console.print(
        f"traffic {traffic['units_per_s']:.3g} units/s, {traffic['requests_per_s']:.3g} requests/s ({traffic['source']})"
    )
    t = Table("guardrail", "stage", "lasts ≥ s", "candidate units", "baseline", "margin", "detects (80%)",
              "non-inferior after s")  # fmt: skip
    for r in result["mde"]:
        scale = r["harm_scale"]
        base = "—" if r["baseline"] is None else f"{r['baseline']:.4g} {r['baseline_source']}"
        ni = "—" if r["noninferiority_s"] is None else f"{r['noninferiority_s']:.0f}"
        detects = _num(r["mde"], scale) if r["mde"] is not None else (r.get("note") or "—")
        if r["detectable"] is False:
            detects = f"[yellow]{detects}[/]"
        t.add_row(r["metric"], f"{r['stage_percent']:g}%", f"{r['seconds']:.0f}", f"{r['units_candidate']:.0f}",
                  base, _num(r["margin"], scale), detects, ni)  # fmt: skip
    console.print(t)


def _plans(path: Path) -> list[tuple[str, Any, str | None]]:
    """(title, plan, route) per rollout in an experiment file, or the file itself as a plan."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if isinstance(doc, dict) and ("experiments" in doc or "variants" in doc or "rollout_plan" in doc):
        _, experiments = load_experiment_file(path)
        found: list[tuple[str, Any, str | None]] = [
            (f"experiment {e['name']}", e.get("rollout_plan"), str(e["route"]))
                 for e in experiments if e.get("mode") == "rollout"]  # fmt: skip
        if not found:
            raise ValueError(f"{path}: no experiment with mode: rollout")
        return found
    return [(str(path), doc, None)]


@app.command()
def check(
    file: Annotated[
        Path, typer.Argument(help="Experiment YAML (rollouts in it) or a rollout plan (YAML/JSON).")
    ],
    route: Annotated[str | None, typer.Option(help="Use this route's recent traffic and baselines.")] = None,
    analytics: AnalyticsOpt = None,
    as_json: JsonOpt = False,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Check rollout plans before creating them: errors, warnings, detectable harm per stage."""
    try:
        plans = _plans(file)
        url = resolve_analytics_url(analytics, state_dir)
        results = [(title, check_remote(url, plan, route or r, token)) for title, plan, r in plans]
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    except AdminError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({title: result for title, result in results}, indent=2))
    else:
        for title, result in results:
            render_check(title, result)
    if any(result["errors"] for _, result in results):
        raise typer.Exit(1)
