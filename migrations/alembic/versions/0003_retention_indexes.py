"""Indexes on outbox_transaction_log.created_at and outbox_consumed_message.consumed_at.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Retention (``outbox purge``) deletes the oldest rows in small batches through these
indexes instead of scanning the tables. On PostgreSQL they are built ``CONCURRENTLY``
(outside a transaction), so producers keep writing while a large table is indexed.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: (index, table, column), as in ``outbox.schema``.
INDEXES = [
    ("outbox_txlog_created_at_idx", "outbox_transaction_log", "created_at"),
    ("outbox_consumed_at_idx", "outbox_consumed_message", "consumed_at"),
]


def _concurrently() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    concurrently = _concurrently()
    with op.get_context().autocommit_block():
        for name, table, column in INDEXES:
            op.create_index(name, table, [column], postgresql_concurrently=concurrently)


def downgrade() -> None:
    concurrently = _concurrently()
    with op.get_context().autocommit_block():
        for name, table, _ in INDEXES:
            op.drop_index(name, table_name=table, postgresql_concurrently=concurrently)
