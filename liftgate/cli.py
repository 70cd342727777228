"""The `liftgate` command line: the composition root's front door."""

from __future__ import annotations

import typer

app = typer.Typer(help="liftgate: evaluate LLM deployments on live traffic.", no_args_is_help=True)


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


def main() -> None:
    app()
