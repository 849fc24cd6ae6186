"""The framework's two tables, as SQLAlchemy Core (Alembic and the Django app create the same)."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, MetaData, PrimaryKeyConstraint, String, Table

metadata = MetaData()

#: One row per transaction id: COMMITTED by the producer's own transaction (its first
#: statement), or ROLLED_BACK by a checker's fence.
transaction_log = Table(
    "outbox_transaction_log",
    metadata,
    Column("transaction_id", String(64), primary_key=True),
    Column("producer_group", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

#: One row per message a consumer group handled, written with the handler's own writes.
consumed_message = Table(
    "outbox_consumed_message",
    metadata,
    Column("consumer_group", String(128), nullable=False),
    Column("message_id", String(64), nullable=False),
    Column("topic", String(255), nullable=False),
    Column("transaction_id", String(64), nullable=True),
    Column("consumed_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("consumer_group", "message_id", name="pk_outbox_consumed_message"),
)

COMMITTED = "COMMITTED"
ROLLED_BACK = "ROLLED_BACK"
