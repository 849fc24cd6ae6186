"""The framework's tables, ORM-free: names, states, sizes and the check's default
timeouts every integration shares.

The SQLAlchemy tables (``outbox.integrations.sqlalchemy.tables``), the Alembic revisions
and the Django models create these same tables from these names.
"""

from __future__ import annotations

#: One row per transaction id: COMMITTED by the producer's own transaction (its first
#: statement), or ROLLED_BACK by a checker's fence.
TRANSACTION_LOG = "outbox_transaction_log"
#: One row per message a consumer group handled, written with the handler's own writes.
CONSUMED_MESSAGE = "outbox_consumed_message"

#: One row per message a call stored in its own transaction because the broker could not
#: take its half message (``on_broker_down="store"``); the relay hands it over and sets
#: ``relayed_at`` (``outbox.stored``, ``outbox.relay``).
STORED_MESSAGE = "outbox_stored_message"

#: The indexes retention deletes by (``outbox.retention``): oldest rows first, no table scan.
TRANSACTION_LOG_CREATED_AT_INDEX = "outbox_txlog_created_at_idx"
CONSUMED_MESSAGE_CONSUMED_AT_INDEX = "outbox_consumed_at_idx"
#: The relay's and retention's way into the stored messages: unrelayed first (NULL), by
#: ``seq``; relayed ones by when.
STORED_MESSAGE_RELAYED_INDEX = "outbox_stored_relayed_idx"
#: A message group's unrelayed messages (a call of that group waits behind them).
STORED_MESSAGE_GROUP_INDEX = "outbox_stored_group_idx"

COMMITTED = "COMMITTED"
ROLLED_BACK = "ROLLED_BACK"

TRANSACTION_ID_LENGTH = 64
MESSAGE_ID_LENGTH = 64
GROUP_LENGTH = 128
TOPIC_LENGTH = 255
STATE_LENGTH = 16

#: How long a check-back's fence waits on a running local transaction before answering
#: UNKNOWN (``OUTBOX_CHECK_LOCK_TIMEOUT_MS``, Django's ``OUTBOX["CHECK_LOCK_TIMEOUT_MS"]``).
DEFAULT_LOCK_TIMEOUT_MS = 2000
#: How long any statement of the check may run (PostgreSQL's ``statement_timeout``).
DEFAULT_STATEMENT_TIMEOUT_MS = 5000
