"""``liftgate users add|list|disable|enable|role|token|revoke-token|link``: who may use the
dashboard and the API (the analytics service's ``/admin/users``, admin role).

A password is never an argument (it would stay in the shell history and in ``ps``): it is
read from standard input when that is not a terminal (``printf '%s\\n' "$PW" | liftgate
users add ana --role operator``), else prompted for twice without echo. An API token is
printed once, when it is made; only its hash is stored.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from pathlib import Path
from typing import Annotated

import typer

from liftgate.admin_client import AdminClient, AdminError, resolve_admin_url, resolve_token

app = typer.Typer(help="Users, roles and API tokens (needs the admin role).", no_args_is_help=True)

AdminOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-url",
        envvar="LIFTGATE_ADMIN_URL",
        help="The analytics service (default: what `liftgate up` recorded, else http://127.0.0.1:8090).",
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", help="Admin token or an admin's API token (else LIFTGATE_TOKEN, …).")
]
StateOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", envvar="LIFTGATE_STATE_DIR", help="Where `liftgate up` keeps its state."),
]
ROLES = ("viewer", "operator", "admin")


def _client(admin_url: str | None, token: str | None, state_dir: Path | None) -> AdminClient:
    try:
        return AdminClient(resolve_admin_url(admin_url, state_dir), resolve_token(token, state_dir))
    except AdminError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _call(client: AdminClient, method: str, path: str, body: object = None) -> object:
    try:
        return client.request(method, path, body)
    except AdminError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _password() -> str:
    if not sys.stdin.isatty():
        line = sys.stdin.readline().rstrip("\r\n")
        if not line:
            typer.echo("error: no password on standard input", err=True)
            raise typer.Exit(2)
        return line
    value: str = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    return value


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@app.command("add")
def add(
    name: str,
    role: Annotated[str, typer.Option("--role", help="viewer, operator or admin.")] = "viewer",
    admin_url: AdminOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Create a user (password from standard input, or prompted for)."""
    if role not in ROLES:
        typer.echo(f"error: --role must be one of {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    client = _client(admin_url, token, state_dir)
    _call(client, "POST", "/admin/users", {"name": name, "role": role, "password": _password()})
    typer.echo(f"user {name} created ({role})")


@app.command("list")
def list_users(
    admin_url: AdminOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """List users with their role and whether they are disabled."""
    rows = _call(_client(admin_url, token, state_dir), "GET", "/admin/users")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    assert isinstance(rows, list)
    if not rows:
        typer.echo(
            "no users yet: add one with `liftgate users add NAME --role viewer|operator|admin`", err=True
        )
    for row in rows:
        state = "disabled" if row["disabled"] else "active"
        typer.echo(f"{row['name']:<24} {row['role']:<9} {state}")


def _patch(
    name: str, body: dict[str, object], admin_url: str | None, token: str | None, state_dir: Path | None
) -> None:
    _call(_client(admin_url, token, state_dir), "PATCH", f"/admin/users/{_q(name)}", body)


@app.command("disable")
def disable(
    name: str, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None
) -> None:
    """Disable a user: their sessions end and their API tokens stop working at once."""
    _patch(name, {"disabled": True}, admin_url, token, state_dir)
    typer.echo(f"user {name} disabled")


@app.command("enable")
def enable(name: str, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None) -> None:
    """Enable a disabled user again."""
    _patch(name, {"disabled": False}, admin_url, token, state_dir)
    typer.echo(f"user {name} enabled")


@app.command("role")
def set_role(
    name: str, role: str, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None
) -> None:
    """Change a user's role (their browser sessions end)."""
    _patch(name, {"role": role}, admin_url, token, state_dir)
    typer.echo(f"user {name} is now {role}")


@app.command("token")
def new_token(
    name: str,
    label: Annotated[str, typer.Option("--label", help="Names the token (one per label).")] = "cli",
    admin_url: AdminOpt = None,
    token: TokenOpt = None,
    state_dir: StateOpt = None,
) -> None:
    """Make an API token for NAME and print it (once: only its hash is kept)."""
    made = _call(
        _client(admin_url, token, state_dir), "POST", f"/admin/users/{_q(name)}/tokens", {"label": label}
    )
    assert isinstance(made, dict)
    typer.echo(made["token"])
    typer.echo(f"(token {label!r} of {name}; shown once — use it as LIFTGATE_TOKEN or --token)", err=True)


@app.command("revoke-token")
def revoke_token(
    name: str, label: str, admin_url: AdminOpt = None, token: TokenOpt = None, state_dir: StateOpt = None
) -> None:
    """Revoke one of NAME's API tokens."""
    _call(_client(admin_url, token, state_dir), "DELETE", f"/admin/users/{_q(name)}/tokens/{_q(label)}")
    typer.echo(f"token {label!r} of {name} revoked")


@app.command("link")
def link(admin_url: AdminOpt = None, state_dir: StateOpt = None) -> None:
    """Print a fresh one-time sign-in link (15 min) for the local `liftgate up` stack."""
    from analytics.service.access import login_ticket
    from liftgate.admin_client import READ_TOKEN_FILE, TOKEN_FILE, _state

    state = _state(state_dir)
    try:
        admin = (state / TOKEN_FILE).read_text().strip()
    except OSError:
        typer.echo(f"error: no {state / TOKEN_FILE}: run `liftgate up` first", err=True)
        raise typer.Exit(2) from None
    try:
        read: str | None = (state / READ_TOKEN_FILE).read_text().strip() or None
    except OSError:
        read = None
    base = resolve_admin_url(admin_url, state_dir).rstrip("/")
    typer.echo(f"{base}/dashboard/login?ticket={login_ticket(admin, read)}")
