"""An application's own Alembic project with halfmoon's revisions in its history.

The recipe of docs/outbox.md ("Your own Alembic history"), written to a folder: the
app's revision (table ``app_orders``) and ours side by side, one ``alembic_version``.
"""

from __future__ import annotations

from pathlib import Path

ALEMBIC_INI = """\
[alembic]
script_location = %(here)s/migrations
# our revisions beside the app's own (package resource notation)
version_locations = %(here)s/migrations/versions outbox.integrations.alembic:versions
path_separator = space
sqlalchemy.url = {url}
"""

ENV_PY = '''\
from alembic import context
from sqlalchemy import Column, MetaData, String, Table, create_engine

from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata

app_metadata = MetaData()
Table("app_orders", app_metadata, Column("id", String(32), primary_key=True))

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    # autogenerate compares both: our tables are not reported as unknown
    context.configure(connection=connection, target_metadata=[app_metadata, outbox_metadata])
    with context.begin_transaction():
        context.run_migrations()
'''

APP_REVISION = '''\
"""The app's orders."""
import sqlalchemy as sa
from alembic import op

revision = "a1f0c0ffee01"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.create_table("app_orders", sa.Column("id", sa.String(32), primary_key=True))


def downgrade():
    op.drop_table("app_orders")
'''

APP_REVISION_ID = "a1f0c0ffee01"


def write_user_project(folder: Path, database_url: str) -> Path:
    """The project's files in ``folder``; returns its alembic.ini."""
    versions = folder / "migrations" / "versions"
    versions.mkdir(parents=True)
    (folder / "migrations" / "env.py").write_text(ENV_PY)
    (versions / f"{APP_REVISION_ID}_orders.py").write_text(APP_REVISION)
    ini = folder / "alembic.ini"
    ini.write_text(ALEMBIC_INI.format(url=database_url.replace("%", "%%")))
    return ini
