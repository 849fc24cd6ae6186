"""Alembic environment for the framework tables alone.

The URL is the ``sqlalchemy.url`` option (``outbox.integrations.alembic.config`` sets it),
else ``OUTBOX_DATABASE_URL``; the version table is ``outbox_alembic_version``, so the
application's own Alembic history in the same database is left alone.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from outbox.integrations.alembic import VERSION_TABLE
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.settings import OutboxSettings

config = context.config
url = config.get_main_option("sqlalchemy.url") or OutboxSettings.from_env().database_url
version_table = config.get_main_option("version_table") or VERSION_TABLE


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Only the framework's tables: the app's own live in the same database."""
    return type_ != "table" or name in metadata.tables


if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True,
                      version_table=version_table)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, include_name=include_name,
                          version_table=version_table)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
