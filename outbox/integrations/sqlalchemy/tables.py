"""The framework's tables, as SQLAlchemy Core.

Alembic (``outbox.integrations.alembic``) and the Django app create these same tables,
column for column and constraint for constraint (``tests/outbox/test_schema_parity.py``).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

from ...schema import (
    COMMITTED,
    CONSUMED_MESSAGE,
    CONSUMED_MESSAGE_CONSUMED_AT_INDEX,
    GROUP_LENGTH,
    MESSAGE_ID_LENGTH,
    ROLLED_BACK,
    STATE_LENGTH,
    STORED_MESSAGE,
    STORED_MESSAGE_GROUP_INDEX,
    STORED_MESSAGE_RELAYED_INDEX,
    TOPIC_LENGTH,
    TRANSACTION_ID_LENGTH,
    TRANSACTION_LOG,
    TRANSACTION_LOG_CREATED_AT_INDEX,
)

metadata = MetaData()

#: Django's ``BigAutoField``: ``bigint`` identity on PostgreSQL; on SQLite only an
#: ``INTEGER PRIMARY KEY`` takes the rowid, so the column is ``INTEGER`` there.
AUTO_ID = BigInteger().with_variant(Integer(), "sqlite")

#: One row per transaction id: COMMITTED by the producer's own transaction (its first
#: statement), or ROLLED_BACK by a checker's fence.
transaction_log = Table(
    TRANSACTION_LOG,
    metadata,
    Column("transaction_id", String(TRANSACTION_ID_LENGTH), primary_key=True),
    Column("producer_group", String(GROUP_LENGTH), nullable=False),
    Column("state", String(STATE_LENGTH), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index(TRANSACTION_LOG_CREATED_AT_INDEX, "created_at"),
)

#: One row per message a consumer group handled, written with the handler's own writes;
#: the unique (consumer_group, message_id) is what makes a redelivery a no-op.
consumed_message = Table(
    CONSUMED_MESSAGE,
    metadata,
    Column("id", AUTO_ID, Identity(), primary_key=True),
    Column("consumer_group", String(GROUP_LENGTH), nullable=False),
    Column("message_id", String(MESSAGE_ID_LENGTH), nullable=False),
    Column("topic", String(TOPIC_LENGTH), nullable=False),
    Column("transaction_id", String(TRANSACTION_ID_LENGTH), nullable=True),
    Column("consumed_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("consumer_group", "message_id", name="uniq_outbox_consumed_message"),
    Index(CONSUMED_MESSAGE_CONSUMED_AT_INDEX, "consumed_at"),
    sqlite_autoincrement=True,
)

#: One row per message a call stored while the broker was down (store mode), in the
#: call's own transaction; ``seq`` is the order the relay hands them over in, and
#: ``relayed_at`` is set once the broker holds it (``outbox.stored``, ``outbox.relay``).
stored_message = Table(
    STORED_MESSAGE,
    metadata,
    Column("seq", AUTO_ID, Identity(), primary_key=True),
    Column("message_id", String(MESSAGE_ID_LENGTH), nullable=False),
    Column("transaction_id", String(TRANSACTION_ID_LENGTH), nullable=False),
    Column("producer_group", String(GROUP_LENGTH), nullable=False),
    Column("topic", String(TOPIC_LENGTH), nullable=False),
    Column("message_group", String(GROUP_LENGTH), nullable=True),
    Column("message", LargeBinary(), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("relayed_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("message_id", name="uniq_outbox_stored_message_id"),
    Index(STORED_MESSAGE_RELAYED_INDEX, "relayed_at", "seq"),
    Index(STORED_MESSAGE_GROUP_INDEX, "producer_group", "message_group", "relayed_at"),
    sqlite_autoincrement=True,
)

__all__ = ["COMMITTED", "ROLLED_BACK", "consumed_message", "metadata", "stored_message", "transaction_log"]
