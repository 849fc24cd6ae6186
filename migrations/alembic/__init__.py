"""The framework tables' Alembic history, shipped inside the package.

``upgrade(database_url)`` is what ``outbox migrate`` runs: our revisions in our own
version table (``outbox_alembic_version``), beside whatever the application keeps in
the same database. To put our revisions in the application's own Alembic history
instead, add ``VERSION_LOCATION`` to its ``version_locations`` and upgrade the
``halfmoon`` branch (docs/outbox.md, "Tables").
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

#: The directory with env.py, script.py.mako and versions/ (Alembic's script_location).
SCRIPT_LOCATION = Path(__file__).resolve().parent
#: Our revisions, for an application's ``version_locations`` (package resource notation).
VERSION_LOCATION = "outbox.integrations.alembic:versions"
#: The branch label of our first revision: ``alembic upgrade halfmoon@head``.
BRANCH = "halfmoon"
#: Where ``upgrade`` records our revision, apart from the application's ``alembic_version``.
VERSION_TABLE = "outbox_alembic_version"


def config(database_url: str) -> Config:
    """An Alembic configuration for our revisions on ``database_url`` (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("version_table", VERSION_TABLE)
    # The options are interpolated like ConfigParser values: a URL-encoded password's
    # "%" must be doubled.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Create or upgrade the framework tables on ``database_url`` to ``revision``."""
    command.upgrade(config(database_url), revision)


def current_revision(database_url: str) -> str | None:
    """Our revision the database on ``database_url`` is at; None before ``upgrade`` created
    the tables."""
    from sqlalchemy import column, create_engine, inspect, select, table

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table(VERSION_TABLE):
                return None
            return connection.execute(select(column("version_num")).select_from(table(VERSION_TABLE))).scalar()
    finally:
        engine.dispose()


def downgrade(database_url: str, revision: str) -> None:
    """Take the framework tables on ``database_url`` back to ``revision`` ("base" drops them)."""
    command.downgrade(config(database_url), revision)


__all__ = ["BRANCH", "SCRIPT_LOCATION", "VERSION_LOCATION", "VERSION_TABLE", "config", "current_revision",
           "downgrade", "upgrade"]
