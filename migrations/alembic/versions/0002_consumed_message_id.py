"""outbox_consumed_message as Django creates it: id primary key, unique (group, message).

The composite primary key (consumer_group, message_id) becomes an ``id`` primary key
plus the unique constraint ``uniq_outbox_consumed_message`` on the same two columns.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Existing rows keep their data and get ids (SQLite: the table is copied in batch mode;
PostgreSQL: the identity column fills itself).
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLE = "outbox_consumed_message"
KEY = ["consumer_group", "message_id"]
UNIQUE = "uniq_outbox_consumed_message"
OLD_PRIMARY_KEY = "pk_outbox_consumed_message"
#: PostgreSQL's own name for an unnamed primary key (what Django's table has).
PRIMARY_KEY = "outbox_consumed_message_pkey"


def upgrade() -> None:
    with op.batch_alter_table(TABLE, table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_constraint(OLD_PRIMARY_KEY, type_="primary")
        batch.add_column(sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                                   sa.Identity(), nullable=False))
        batch.create_primary_key(PRIMARY_KEY, ["id"])
        batch.create_unique_constraint(UNIQUE, KEY)


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_constraint(UNIQUE, type_="unique")
        batch.drop_column("id")  # and with it its primary key
        batch.create_primary_key(OLD_PRIMARY_KEY, KEY)
