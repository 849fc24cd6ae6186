"""outbox_stored_message: the messages store mode keeps while the broker is down.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28

A call of a producer with ``on_broker_down="store"`` that cannot reach the broker writes
its messages here in its own transaction; the relay hands them over and sets
``relayed_at`` (``outbox.stored``, ``outbox.relay``). Column for column the table of
``outbox.integrations.sqlalchemy.tables.stored_message``; a new table, so its indexes are
built with it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLE = "outbox_stored_message"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.Identity(), primary_key=True),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("transaction_id", sa.String(64), nullable=False),
        sa.Column("producer_group", sa.String(128), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("message_group", sa.String(128), nullable=True),
        sa.Column("message", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("relayed_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("message_id", name="uniq_outbox_stored_message_id"),
        sqlite_autoincrement=True,
    )
    op.create_index("outbox_stored_relayed_idx", TABLE, ["relayed_at", "seq"])
    op.create_index("outbox_stored_group_idx", TABLE, ["producer_group", "message_group", "relayed_at"])


def downgrade() -> None:
    op.drop_table(TABLE)  # and with it its indexes
