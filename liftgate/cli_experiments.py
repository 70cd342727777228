"""``liftgate experiments``: create from YAML, list, show, start, pause, stop (the control plane's
admin API at the one admin base URL; see ``liftgate.admin_client``)."""

from __future__ import annotations

import json
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
    resolve_token,
)
from liftgate.cli_rollout import check_remote, render_check
from liftgate.experiment_file import load_experiment_file

app = typer.Typer(help="Manage experiments through the control plane's admin API.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)

GatewayOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-url",
        "--gateway",
        envvar="LIFTGATE_ADMIN_URL",
        help="Admin base URL: the analytics service (default: what `liftgate up` recorded, else "
        "http://127.0.0.1:8090). A gateway URL also works: its /admin serves the same routes.",
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="LIFTGATE_ADMIN_TOKEN",
        help="Admin token (default: LIFTGATE_ADMIN_TOKEN, else <state dir>/admin_token from `liftgate up`).",
    ),
]
StateOpt = Annotated[
    Path,
    typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
]
DEFAULT_GATEWAY: str | None = None  # resolved by admin_client.resolve_admin_url
AnalyticsOpt = Annotated[
    str | None,
    typer.Option(
        "--analytics",
        envvar="LIFTGATE_ANALYTICS_URL",
        help="Analytics service (checks rollout plans; default: what a running `liftgate up` recorded).",
    ),
]


def _client(admin_url: str | None, token: str | None, state_dir: Path) -> AdminClient:
    try:
        return AdminClient(resolve_admin_url(admin_url, state_dir), resolve_token(token, state_dir))
    except AdminError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _fail(exc: AdminError) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


@app.command()
def create(
    file: Annotated[Path, typer.Option("-f", "--file", help="Experiment YAML (see docs/concepts.md).")],
    start: Annotated[bool, typer.Option(help="Start the experiment(s) right after creating them.")] = False,
    exist_ok: Annotated[
        bool, typer.Option("--exist-ok", help="Skip experiments that already exist instead of failing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check rollout plans with the analytics service first.")
    ] = True,
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    analytics: AnalyticsOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Create experiments (and any upstreams they list) from a YAML file.

    Rollout plans are checked first: warnings are printed, and a plan with errors is refused
    (nothing is created).
    """
    try:
        upstreams, experiments = load_experiment_file(file)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if check:
        _check_rollouts(experiments, resolve_analytics_url(analytics, state_dir))
    client = _client(gateway, token, state_dir)
    try:
        known = {u.get("name") for u in client.upstreams()}
        existing = {e.get("name") for e in client.experiments()} if exist_ok else set()
        for up in upstreams:
            if up["name"] in known:
                console.print(f"upstream {up['name']} exists: kept")
                continue
            client.create_upstream(up)
            console.print(f"upstream {up['name']} created")
        for exp in experiments:
            if exp["name"] in existing:
                console.print(f"experiment {exp['name']} exists: kept")
                continue
            created = client.create_experiment(exp)
            console.print(f"experiment {created.get('name', exp['name'])} created (id {created.get('id')})")
            if start:
                started = client.action(exp["name"], "start")
                console.print(f"experiment {exp['name']} {started.get('status', 'started')}")
    except AdminError as exc:
        raise _fail(exc) from None


def _check_rollouts(experiments: list[dict[str, Any]], analytics: str) -> None:
    refused = []
    for exp in experiments:
        if exp.get("mode") != "rollout":
            continue
        try:
            result = check_remote(analytics, exp.get("rollout_plan"), str(exp["route"]))
        except AdminError as exc:
            err.print(f"[red]error:[/red] cannot check the rollout plan of {exp['name']}: {exc}; "
                      "start the analytics service, pass --analytics URL, or --no-check")  # fmt: skip
            raise typer.Exit(2) from None
        render_check(f"rollout plan of {exp['name']}", result, table=False)
        if result["errors"]:
            refused.append(str(exp["name"]))
    if refused:
        err.print(f"[red]error:[/red] invalid rollout plan(s) for {', '.join(refused)}: nothing created")
        raise typer.Exit(1)


def _variants(exp: dict[str, Any]) -> str:
    parts = []
    for v in exp.get("variants") or []:
        mark = "*" if v.get("is_control") else ""
        parts.append(f"{v.get('name')}{mark}:{v.get('weight')}")
    return " ".join(parts)


@app.command("list")
def list_(
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List experiments: route, mode, status and variants (* marks the control)."""
    client = _client(gateway, token, state_dir)
    try:
        items = client.experiments()
    except AdminError as exc:
        raise _fail(exc) from None
    if as_json:
        console.print_json(json.dumps(items, default=str))
        return
    table = Table()
    for col in ("id", "name", "route", "mode", "status", "variants (weight)"):
        table.add_column(col)
    for exp in items:
        table.add_row(
            str(exp.get("id", "")), str(exp.get("name")), str(exp.get("route")), str(exp.get("mode")),
            str(exp.get("status")), _variants(exp),
        )  # fmt: skip
    console.print(table)


@app.command()
def show(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Print one experiment's full configuration as JSON."""
    client = _client(gateway, token, state_dir)
    try:
        console.print_json(json.dumps(client.experiment(experiment), default=str))
    except AdminError as exc:
        raise _fail(exc) from None


def _action(action: str, experiment: str, gateway: str | None, token: str | None, state_dir: Path) -> None:
    client = _client(gateway, token, state_dir)
    try:
        result = client.action(experiment, action)
    except AdminError as exc:
        raise _fail(exc) from None
    console.print(f"experiment {result.get('name', experiment)}: {result.get('status', action)}")


@app.command()
def start(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Start routing the experiment's traffic (a route has at most one running experiment)."""
    _action("start", experiment, gateway, token, state_dir)


@app.command()
def pause(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Pause: the route serves its control only until the experiment is started again."""
    _action("pause", experiment, gateway, token, state_dir)


@app.command()
def stop(
    experiment: Annotated[str, typer.Argument(help="Experiment name or id.")],
    gateway: GatewayOpt = DEFAULT_GATEWAY,
    token: TokenOpt = None,
    state_dir: StateOpt = Path(".liftgate"),
) -> None:
    """Stop the experiment for good (its data and reports stay)."""
    _action("stop", experiment, gateway, token, state_dir)
