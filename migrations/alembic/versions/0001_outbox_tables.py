"""The framework tables: outbox_transaction_log and outbox_consumed_message.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = ("halfmoon",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_transaction_log",
        sa.Column("transaction_id", sa.String(64), primary_key=True),
        sa.Column("producer_group", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "outbox_consumed_message",
        sa.Column("consumer_group", sa.String(128), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("transaction_id", sa.String(64), nullable=True),
        sa.Column("consumed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("consumer_group", "message_id", name="pk_outbox_consumed_message"),
    )


def downgrade() -> None:
    op.drop_table("outbox_consumed_message")
    op.drop_table("outbox_transaction_log")
