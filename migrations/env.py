"""Alembic environment: the framework's tables, on ``OUTBOX_DATABASE_URL``."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from outbox.integrations.sqlalchemy.tables import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get(
    "OUTBOX_DATABASE_URL", "sqlite:///outbox.sqlite3"
)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Only the framework's tables: the app's own live in the same database."""
    return type_ != "table" or name in metadata.tables


if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True,
                      version_table=config.get_main_option("version_table"))
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, include_name=include_name,
                          version_table=config.get_main_option("version_table"))
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
