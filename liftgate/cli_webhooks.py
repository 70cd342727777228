"""``liftgate webhooks add|list|remove|test|deliveries``: notifications through the control plane.

Every command talks to the admin API (``/admin/webhooks``, the one admin base URL: what
``liftgate up`` recorded unless ``--admin-url`` says otherwise) with the admin token. A
webhook's secret is write-only: pass it with ``--secret`` or, to keep it out of the shell's
history, ``LIFTGATE_WEBHOOK_SECRET``. See docs/notifications.md for payloads and signatures.
"""

from __future__ import annotations

import getpass
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from liftgate.admin_client import AdminClient, AdminError, resolve_admin_url, resolve_token

app = typer.Typer(help="Webhook notifications: rollout decisions, SRM, guardrails, gates, RL risks.",
                  no_args_is_help=True)  # fmt: skip
console = Console()
err = Console(stderr=True)

AdminOpt = Annotated[
    str | None,
    typer.Option("--admin-url", "--analytics", envvar=["LIFTGATE_ADMIN_URL", "LIFTGATE_ANALYTICS_URL"],
                 help="The admin base URL (default: what `liftgate up` recorded, else http://127.0.0.1:8090)."),
]  # fmt: skip
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="LIFTGATE_ADMIN_TOKEN", help="Admin token.")]
StateOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
]
ActorOpt = Annotated[str | None, typer.Option("--actor", help="Operator name for the audit log.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON.")]
Name = Annotated[str, typer.Argument(help="Webhook name.")]


class _Client(AdminClient):
    def __init__(self, base_url: str, token: str, actor: str) -> None:
        super().__init__(base_url, token)
        self._actor = actor

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/json",
                "X-Liftgate-Actor": self._actor,
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail", exc.reason)
            except ValueError:
                detail = exc.reason
            raise AdminError(exc.code, f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(0, f"{method} {path}: cannot reach {self.base_url} ({exc})") from None
        return json.loads(raw) if raw else None


def _client(admin_url: str | None, token: str | None, state_dir: Path | None, actor: str | None) -> _Client:
    try:
        return _Client(resolve_admin_url(admin_url, state_dir), resolve_token(token, state_dir),
                       actor or getpass.getuser())  # fmt: skip
    except AdminError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None


def _do(client: _Client, method: str, path: str, body: Any = None) -> Any:
    try:
        return client.call(method, path, body)
    except AdminError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None


@app.command("add")
def add(
    url: Annotated[str, typer.Argument(help="Where to POST notifications (http or https).")],
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="A name for this webhook (letters, digits, _.-; default: the URL's host and port)."
        ),
    ] = None,
    secret: Annotated[
        str | None,
        typer.Option(
            "--secret",
            envvar="LIFTGATE_WEBHOOK_SECRET",
            help="Signing secret (16+ characters; required for --format json).",
        ),
    ] = None,
    events: Annotated[
        str,
        typer.Option(
            "--events", help="Comma-separated kinds, or * for all (`liftgate webhooks kinds` lists them)."
        ),
    ] = "*",
    fmt: Annotated[str, typer.Option("--format", help="json (signed, generic) or slack.")] = "json",
    admin_url: AdminOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
    actor: ActorOpt = None,
) -> None:
    """Add a webhook."""
    client = _client(admin_url, token, state_dir, actor)
    kinds = [e.strip() for e in events.split(",") if e.strip()]
    if name is None:
        parts = urllib.parse.urlsplit(url)
        name = re.sub(r"[^A-Za-z0-9_.\-]", "-", parts.netloc.rpartition("@")[2]) or "webhook"
    body = {"name": name, "url": url, "secret": secret, "format": fmt, "events": kinds}
    out = _do(client, "POST", "/admin/webhooks", body)
    console.print(f"added webhook [bold]{out['name']}[/] → {out['url']} ({out['format']}, "
                  f"{'signed' if out['signed'] else 'unsigned'}): {', '.join(out['events'])}")  # fmt: skip


@app.command("list")
def list_(admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None,
          as_json: JsonOpt = False) -> None:  # fmt: skip
    """List webhooks (URLs shown as scheme and host only; secrets never)."""
    hooks = _do(_client(admin_url, token, state_dir, None), "GET", "/admin/webhooks")
    if as_json:
        typer.echo(json.dumps(hooks, indent=2))
        return
    table = Table("name", "url", "format", "signed", "events")
    for h in hooks:
        table.add_row(
            h["name"], h["url"], h["format"], "yes" if h["signed"] else "no", ", ".join(h["events"])
        )
    console.print(table)


@app.command("remove")
def remove(name: Name, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None,
           actor: ActorOpt = None) -> None:  # fmt: skip
    """Remove a webhook (its pending deliveries and delivery log go with it)."""
    _do(_client(admin_url, token, state_dir, actor), "DELETE", f"/admin/webhooks/{AdminClient._q(name)}")
    console.print(f"removed webhook [bold]{name}[/]")


@app.command("test")
def test(name: Name, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None,
         actor: ActorOpt = None, as_json: JsonOpt = False) -> None:  # fmt: skip
    """Send a test notification now; exits 1 when the receiver did not accept it."""
    out = _do(
        _client(admin_url, token, state_dir, actor), "POST", f"/admin/webhooks/{AdminClient._q(name)}/test"
    )
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    elif out["status"] == "delivered":
        console.print(
            f"delivered {out['event_id']} to {name}: HTTP {out['last_status']} in {out['latency_ms']:.0f} ms"
        )
    else:
        err.print(f"[red]not delivered[/] to {name}: {out['last_error']}")
    if out["status"] != "delivered":
        raise typer.Exit(1)


@app.command("deliveries")
def deliveries(
    name: Annotated[str | None, typer.Argument(help="Webhook name (default: all).")] = None,
    status: Annotated[str | None, typer.Option("--status", help="pending, delivered or failed.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    admin_url: AdminOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The delivery log, newest first: status, attempts, last error, latency."""
    query = f"?limit={limit}" + (f"&status={status}" if status else "")
    if name:
        query += f"&webhook={AdminClient._q(name)}"
    rows = _do(_client(admin_url, token, state_dir, None), "GET", f"/admin/notifications/deliveries{query}")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("time", "webhook", "event", "type", "status", "attempts", "last", "latency")
    for r in rows:
        last = r["last_error"] or (str(r["last_status"]) if r["last_status"] else "—")
        latency = "—" if r["latency_ms"] is None else f"{r['latency_ms']:.0f} ms"
        table.add_row(r["created_at"][:19], r["webhook"], r["event_id"], r["type"], r["status"],
                      str(r["attempts"]), last, latency)  # fmt: skip
    console.print(table)


@app.command("kinds")
def kinds(admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None) -> None:
    """The event kinds a webhook can subscribe to."""
    for kind, meaning in _do(
        _client(admin_url, token, state_dir, None), "GET", "/admin/notifications/kinds"
    ).items():
        console.print(f"[bold]{kind}[/]  {meaning}")
