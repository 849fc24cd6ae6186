"""Retention of ``outbox_stored_message`` through the SQLAlchemy wrapper: relayed rows go
after the transaction_log age, unrelayed rows never do; only the purged groups' rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, select

from broker_embedded import EmbeddedBroker, Message
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import stored_message
from outbox.retention import PurgeOptions, RetentionPolicy
from outbox.schema import STORED_MESSAGE
from outbox.stored import encode

NOW = datetime.now(UTC)
MONTH, DAY = timedelta(days=30), timedelta(days=1)


def _stored_rows(engine: Engine, rows: dict[str, tuple[timedelta, timedelta | None]], group: str = "shop") -> None:
    """``message id -> (age, relayed how long ago or None)``."""
    with engine.begin() as conn:
        conn.execute(insert(stored_message), [
            {"message_id": message_id, "transaction_id": f"tx-{message_id}", "producer_group": group,
             "topic": "order.paid", "message_group": None, "message": encode(Message("order.paid", b"{}")),
             "created_at": NOW - age, "relayed_at": None if relayed is None else NOW - relayed}
            for message_id, (age, relayed) in rows.items()])


def _stored_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(stored_message.c.message_id)).scalars())


def test_relayed_stored_messages_age_out_and_unrelayed_ones_never_do(engine: Engine,
                                                                     broker: EmbeddedBroker) -> None:
    _stored_rows(engine, {"relayed-long-ago": (MONTH, MONTH), "relayed-today": (MONTH, timedelta(0)),
                          "waiting": (MONTH, None)})
    _stored_rows(engine, {"other-service": (MONTH, MONTH)}, group="billing")
    policy = RetentionPolicy(margin_s=DAY.total_seconds())

    dry = purge_engine(engine, policy, broker.open_transactions, PurgeOptions(dry_run=True, producer_groups=["shop"]))
    assert dry.rows()[STORED_MESSAGE] == 1 and len(_stored_ids(engine)) == 4
    report = purge_engine(engine, policy, broker.open_transactions, PurgeOptions(pause_s=0, producer_groups=["shop"]))
    assert report.rows()[STORED_MESSAGE] == 1
    assert _stored_ids(engine) == {"relayed-today", "waiting", "other-service"}
    purge_engine(engine, policy, broker.open_transactions, PurgeOptions(pause_s=0))  # every group
    assert _stored_ids(engine) == {"relayed-today", "waiting"}
