"""Retention on SQLite and PostgreSQL with a real in-process broker: what goes, what stays
(pending and parked transactions, young rows), dry runs, bounded batches, a broker that
cannot be asked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select

from broker_embedded import (
    BrokerClient,
    BrokerConfig,
    EmbeddedBroker,
    Message,
    Resolution,
    TransactionState,
)
from broker_embedded.store.config import StoreConfig
from outbox.errors import ConfigurationError
from outbox.integrations.sqlalchemy.retention import purge_engine
from outbox.integrations.sqlalchemy.tables import consumed_message, transaction_log
from outbox.retention import PurgeOptions, RetentionPolicy, TablePurge, parse_duration
from outbox.schema import COMMITTED, CONSUMED_MESSAGE, ROLLED_BACK, STORED_MESSAGE, TRANSACTION_LOG
from outbox.settings import OutboxSettings
from tests.ports import free_port

NOW = datetime.now(UTC)
POLICY = RetentionPolicy()  # the broker's defaults, a week's margin and dedup window
FAST = PurgeOptions(pause_s=0)


@pytest.fixture
def checked_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker whose checks of group ``shop`` are taken and never answered: a transaction
    is parked after one check, unless its own timeout is long."""
    config = BrokerConfig(store=StoreConfig(segment_size=1 << 20), transaction_timeout_s=0.2, check_interval_s=0.2,
                          check_max=1)
    broker = EmbeddedBroker(tmp_path / "broker", config)
    broker.register_producer("shop", lambda request: None)
    yield broker
    broker.close()


def _log_rows(engine: Engine, *rows: tuple[str, str, timedelta], group: str = "shop") -> None:
    with engine.begin() as conn:
        conn.execute(insert(transaction_log), [
            {"transaction_id": tx, "producer_group": group, "state": state, "created_at": NOW - age}
            for tx, state, age in rows])


def _consumed_rows(engine: Engine, ages: dict[str, timedelta]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(consumed_message), [
            {"consumer_group": "points", "message_id": message_id, "topic": "order.paid", "consumed_at": NOW - age}
            for message_id, age in ages.items()])


def _ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(transaction_log.c.transaction_id)).scalars())


def _message_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(consumed_message.c.message_id)).scalars())


def _half(broker: EmbeddedBroker, transaction_id: str, timeout_s: float | None = None) -> None:
    broker.send_half(Message("orders", transaction_id.encode(), transaction_timeout_s=timeout_s),
                     producer_group="shop", transaction_id=transaction_id)


def test_old_resolved_rows_go_pending_parked_and_young_ones_stay(engine: Engine,
                                                                 checked_broker: EmbeddedBroker) -> None:
    broker = checked_broker
    _half(broker, "parked")
    _half(broker, "pending", timeout_s=3600)
    for tx, resolution in (("committed", Resolution.COMMIT), ("rolled-back", Resolution.ROLLBACK),
                           ("young", Resolution.COMMIT)):
        _half(broker, tx)
        broker.end_transaction(tx, resolution, producer_group="shop")
    deadline = time.monotonic() + 30
    while broker.transaction_state("parked") is not TransactionState.PARKED:
        assert time.monotonic() < deadline, "the transaction was never parked"
        time.sleep(0.05)
    month = timedelta(days=30)
    # the local commits of the open transactions happened long ago: the broker still asks about them
    _log_rows(engine, ("parked", COMMITTED, month), ("pending", COMMITTED, month), ("committed", COMMITTED, month),
              ("rolled-back", ROLLED_BACK, month), ("never-sent", ROLLED_BACK, month),
              ("young", COMMITTED, timedelta(days=6)))

    dry = purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(dry_run=True))
    assert dry.dry_run and dry.rows() == {TRANSACTION_LOG: 3, CONSUMED_MESSAGE: 0, STORED_MESSAGE: 0}
    assert dry.tables[0].kept_open == 2 and len(_ids(engine)) == 6

    seen: list[TablePurge] = []
    report = purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(batch_size=1, pause_s=0),
                          seen.append)
    assert _ids(engine) == {"parked", "pending", "young"}
    assert report.rows() == {TRANSACTION_LOG: 3, CONSUMED_MESSAGE: 0, STORED_MESSAGE: 0} and report.skipped == {}
    assert report.tables[0].batches == 3 and report.tables[0].kept_open == 2
    assert [(p.rows, p.batches) for p in seen] == [(1, 1), (2, 2), (3, 3)]
    assert "3 rows deleted in 3 batches" in str(report) and "2 kept (open at the broker)" in str(report)

    # an age override below the horizon still keeps what is open; it takes the young row
    overridden = purge_engine(engine, POLICY, broker.open_transactions,
                              PurgeOptions(pause_s=0, transaction_log_older_than_s=86400))
    assert overridden.rows()[TRANSACTION_LOG] == 1 and _ids(engine) == {"parked", "pending"}

    # resolved at last: the rows go
    broker.resolve_parked("parked", force=Resolution.ROLLBACK)
    broker.end_transaction("pending", Resolution.COMMIT, producer_group="shop")
    assert purge_engine(engine, POLICY, broker.open_transactions, FAST).rows()[TRANSACTION_LOG] == 2
    assert _ids(engine) == set()


def test_open_transactions_of_one_group_only(engine: Engine, broker: EmbeddedBroker) -> None:
    broker.send_half(Message("orders", b"x"), producer_group="billing", transaction_id="billing-open")
    _log_rows(engine, ("billing-open", COMMITTED, timedelta(days=30)), ("billing-old", COMMITTED, timedelta(days=30)),
              group="billing")
    _log_rows(engine, ("shop-old", COMMITTED, timedelta(days=30)))
    asked: list[str | None] = []

    def open_transactions(group: str | None) -> list[str]:
        asked.append(group)
        return broker.open_transactions(group)

    options = PurgeOptions(pause_s=0, producer_groups=["shop"], tables=[TRANSACTION_LOG])
    report = purge_engine(engine, POLICY, open_transactions, options)
    assert report.rows() == {TRANSACTION_LOG: 1} and _ids(engine) == {"billing-open", "billing-old"}
    assert asked == ["shop"]
    report = purge_engine(engine, POLICY, open_transactions, PurgeOptions(pause_s=0, producer_groups=["billing"]))
    assert report.rows()[TRANSACTION_LOG] == 1 and report.tables[0].kept_open == 1
    assert _ids(engine) == {"billing-open"} and asked == ["shop", "billing"]


def test_each_batch_asks_the_broker_after_selecting_so_a_transaction_opened_during_the_purge_keeps_its_row(
        engine: Engine, broker: EmbeddedBroker) -> None:
    """A transaction that becomes open after the purge began (its half message, then its
    row, stamped a month ago as a wrong clock or an old release would) is open when the
    batch that selects its row asks the broker: the row stays."""
    _log_rows(engine, *((f"done-{n}", COMMITTED, timedelta(days=30, seconds=10 - n)) for n in range(3)))
    asked: list[str | None] = []

    def open_transactions(group: str | None) -> list[str]:
        asked.append(group)
        return broker.open_transactions(group)

    def after_batch(progress: TablePurge) -> None:
        if progress.batches == 1:  # a producer commits while the purge runs
            _half(broker, "late")
            _log_rows(engine, ("late", COMMITTED, timedelta(days=30)))

    report = purge_engine(engine, POLICY, open_transactions, PurgeOptions(batch_size=1, pause_s=0), after_batch)
    assert _ids(engine) == {"late"} and report.rows()[TRANSACTION_LOG] == 3 and report.tables[0].kept_open == 1
    assert len(asked) == 4  # once per batch that found rows


def test_no_purge_age_is_below_the_brokers_check_horizon(engine: Engine, broker: EmbeddedBroker) -> None:
    _log_rows(engine, ("done", COMMITTED, timedelta(minutes=2)))
    assert POLICY.min_age_s == 6 + 5 * 15
    with pytest.raises(ConfigurationError, match="may still be checked by the broker"):
        purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(transaction_log_older_than_s=80))
    assert _ids(engine) == {"done"}
    # only consumed_message: the transaction_log age does not matter
    purge_engine(engine, POLICY, broker.open_transactions,
                 PurgeOptions(tables=[CONSUMED_MESSAGE], transaction_log_older_than_s=0))
    report = purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(transaction_log_older_than_s=81))
    assert report.rows()[TRANSACTION_LOG] == 1 and _ids(engine) == set()


def test_consumed_messages_older_than_the_dedup_window_go_in_bounded_batches(engine: Engine,
                                                                            broker: EmbeddedBroker) -> None:
    ages = {f"old-{n}": timedelta(days=8, minutes=n) for n in range(25)}
    _consumed_rows(engine, {**ages, "six-days": timedelta(days=6), "now": timedelta(0)})

    dry = purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(dry_run=True))
    assert dry.rows()[CONSUMED_MESSAGE] == 25 and len(_message_ids(engine)) == 27

    seen: list[TablePurge] = []
    report = purge_engine(engine, POLICY, broker.open_transactions, PurgeOptions(batch_size=10, pause_s=0),
                          seen.append)
    assert _message_ids(engine) == {"six-days", "now"}
    assert [(p.table, p.rows) for p in seen] == [(CONSUMED_MESSAGE, 10), (CONSUMED_MESSAGE, 20),
                                                (CONSUMED_MESSAGE, 25)]
    assert report.tables[1].batches == 3

    shorter = purge_engine(engine, RetentionPolicy(dedup_window_s=86400), broker.open_transactions, FAST)
    assert shorter.rows()[CONSUMED_MESSAGE] == 1 and _message_ids(engine) == {"now"}
    only_log = purge_engine(engine, POLICY, broker.open_transactions,
                            PurgeOptions(tables=[TRANSACTION_LOG], consumed_message_older_than_s=0))
    assert [t.table for t in only_log.tables] == [TRANSACTION_LOG] and _message_ids(engine) == {"now"}


def test_a_broker_that_cannot_be_asked_keeps_every_transaction_log_row(engine: Engine) -> None:
    _log_rows(engine, ("old", COMMITTED, timedelta(days=30)))
    _consumed_rows(engine, {"old": timedelta(days=30)})
    with BrokerClient(f"tcp://127.0.0.1:{free_port()}", timeout_s=2, connect_timeout_s=2) as nobody:
        report = purge_engine(engine, POLICY, nobody.open_transactions, FAST)
    assert set(report.skipped) == {TRANSACTION_LOG} and "cannot say which transactions are open" in str(report)
    assert report.rows() == {CONSUMED_MESSAGE: 1, STORED_MESSAGE: 0}
    assert _ids(engine) == {"old"} and _message_ids(engine) == set()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(transaction_log)).scalar_one() == 1


def test_retention_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OutboxSettings.from_env().retention == RetentionPolicy()
    for variable, value in (("OUTBOX_BROKER_TRANSACTION_TIMEOUT_S", "60"), ("OUTBOX_BROKER_CHECK_INTERVAL_S", "10"),
                            ("OUTBOX_BROKER_CHECK_MAX", "3"), ("OUTBOX_RETENTION_MARGIN_S", "0"),
                            ("OUTBOX_DEDUP_WINDOW_S", "3600")):
        monkeypatch.setenv(variable, value)
    policy = OutboxSettings.from_env().retention
    assert policy.check_horizon_s == 90 and policy.dedup_window_s == 3600
    monkeypatch.setenv("OUTBOX_BROKER_CHECK_MAX", "many")
    with pytest.raises(ConfigurationError):
        OutboxSettings.from_env()
    monkeypatch.setenv("OUTBOX_BROKER_CHECK_MAX", "-1")
    with pytest.raises(ConfigurationError):
        OutboxSettings.from_env()


def test_bad_options_and_settings_are_typed_errors() -> None:
    assert parse_duration("7d") == 7 * 86400 and parse_duration("90") == 90 and parse_duration("1.5h") == 5400
    for bad in ("", "7 days", "-1s", "d"):
        with pytest.raises(ConfigurationError):
            parse_duration(bad)
    for options in ({"batch_size": 0}, {"batch_size": 10_001}, {"tables": ["orders"]}, {"pause_s": -1},
                    {"producer_groups": []}, {"consumed_message_older_than_s": -5}):
        with pytest.raises(ConfigurationError):
            PurgeOptions(**options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        RetentionPolicy(dedup_window_s=-1)
    assert RetentionPolicy().check_horizon_s == 6 + 5 * 15 + 7 * 86400
