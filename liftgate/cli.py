"""The `liftgate` command line: the composition root's front door."""

from __future__ import annotations

import sys

import typer

# A traceback never shows local values (a database URL's password, a token).
app = typer.Typer(
    help="liftgate: evaluate LLM deployments on live traffic.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.command()
def migrate(
    database_url: str = typer.Option(
        ..., envvar="LIFTGATE_DATABASE_URL", help="SQLAlchemy URL of the database."
    ),
    revision: str = typer.Option("head", help="Alembic revision to upgrade to."),
) -> None:
    """Apply the database migrations (alembic upgrade)."""
    from liftgate import db

    db.upgrade(database_url, revision)
    typer.echo(f"database at revision {revision}")


from liftgate import cli_experiments, cli_feedback, cli_simulate, up  # noqa: E402  (front door)

app.command("up")(up.up)
app.command("simulate")(cli_simulate.simulate)
app.add_typer(cli_experiments.app, name="experiments")
app.add_typer(cli_feedback.app, name="feedback")
from liftgate import cli_report  # noqa: E402

app.command("report")(cli_report.report)
from liftgate import cli_rollout  # noqa: E402

app.add_typer(cli_rollout.app, name="rollout")
from liftgate import cli_eval  # noqa: E402

app.add_typer(cli_eval.app, name="eval")
from liftgate import cli_datasets  # noqa: E402

app.add_typer(cli_datasets.app, name="datasets")
from liftgate import cli_users  # noqa: E402

app.add_typer(cli_users.app, name="users")
from liftgate import cli_webhooks  # noqa: E402

app.add_typer(cli_webhooks.app, name="webhooks")


def database_problem(exc: BaseException) -> str | None:
    """The message for a command that reads the database directly (eval, datasets, migrate)
    and could not reach it, or found no liftgate tables there; None for any other error. The
    driver's reason names host, port and table, never the URL's password."""
    orig = getattr(exc, "orig", exc)  # SQLAlchemy wraps the driver's error
    psycopg = sys.modules.get("psycopg")  # not imported: the error cannot be the driver's
    if psycopg is None or not isinstance(orig, psycopg.Error):
        return None
    reason = str(orig).strip()
    if isinstance(orig, psycopg.OperationalError) and reason.startswith("connection failed"):
        return (
            f"error: cannot reach the database: {reason}\n"
            "Is `liftgate up` running? Otherwise point LIFTGATE_DATABASE_URL (or --database-url) at "
            "the PostgreSQL that liftgate uses."
        )
    if isinstance(orig, psycopg.errors.UndefinedTable):
        return (
            f"error: the database has no liftgate tables ({reason.splitlines()[0]})\n"
            "Run `liftgate migrate --database-url URL` on it first (`liftgate up` migrates its own)."
        )
    return None


def main() -> None:
    try:
        app()
    except Exception as exc:
        message = database_problem(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(1) from None
