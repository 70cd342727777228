"""Alembic environment: the target metadata is the contracts' table definitions."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import engine_from_config, pool

import curation.tables  # noqa: F401  (registers the curation tables on the shared metadata)
from contracts.tables import metadata

config = context.config
if not config.get_main_option("sqlalchemy.url") and os.environ.get("LIFTGATE_DATABASE_URL"):
    # Run by hand with alembic.ini: the URL comes from the same variable the services read.
    config.set_main_option("sqlalchemy.url", os.environ["LIFTGATE_DATABASE_URL"].replace("%", "%%"))


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        engine = engine_from_config(
            config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
        )
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=metadata, compare_type=True)
            with context.begin_transaction():
                context.run_migrations()
        engine.dispose()
    else:
        context.configure(connection=connectable, target_metadata=metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
