"""Every interleaving of a check-back with the local transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine

from broker_embedded import Resolution
from outbox import TransactionFencedError, check_transaction
from outbox.integrations.sqlalchemy.recorder import record_committed


def _check_in_thread(engine: Engine, tx: str, timeout_ms: int = 20_000) -> tuple[threading.Thread, list]:
    answer: list[Resolution] = []
    thread = threading.Thread(target=lambda: answer.append(check_transaction(engine, tx, "pg", timeout_ms)))
    thread.start()
    return thread, answer


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_check_during_the_local_transaction_waits_for_its_outcome(engine: Engine, outcome: str) -> None:
    with engine.connect() as conn:
        transaction = conn.begin()
        record_committed(conn, "t1", "pg")
        thread, answer = _check_in_thread(engine, "t1")
        time.sleep(0.5)
        assert thread.is_alive() and not answer, "the check must wait for the running transaction"
        transaction.commit() if outcome == "commit" else transaction.rollback()
    thread.join(30)
    assert answer == [Resolution.COMMIT if outcome == "commit" else Resolution.ROLLBACK]
    # Every answer is final: asking again gives the same.
    assert check_transaction(engine, "t1", "pg") is answer[0]


def test_a_check_before_the_transaction_fences_it_out(engine: Engine) -> None:
    assert check_transaction(engine, "t2", "pg") is Resolution.ROLLBACK
    with engine.connect() as conn:
        with pytest.raises(TransactionFencedError):
            with conn.begin():
                record_committed(conn, "t2", "pg")
    assert check_transaction(engine, "t2", "pg") is Resolution.ROLLBACK


def test_lock_timeout_answers_unknown_and_a_later_check_is_final(engine: Engine) -> None:
    with engine.connect() as conn:
        transaction = conn.begin()
        record_committed(conn, "t3", "pg")
        assert check_transaction(engine, "t3", "pg", lock_timeout_ms=200) is Resolution.UNKNOWN
        transaction.commit()
    assert check_transaction(engine, "t3", "pg") is Resolution.COMMIT


def test_broker_rechecks_after_unknown_until_the_answer_is_final(engine: Engine, tmp_path) -> None:
    """A long local transaction: the broker's check-backs time out on its lock (UNKNOWN,
    nothing sent) until it commits; the next check-back answers COMMIT."""
    from broker_embedded import BrokerConfig, EmbeddedBroker, Message, TransactionState
    from broker_embedded.store.config import StoreConfig
    from outbox import Producer
    from outbox.producer import TRANSACTION_ID_PROPERTY

    broker = EmbeddedBroker(tmp_path / "rechecks", BrokerConfig(
        store=StoreConfig(segment_size=1 << 20), transaction_timeout_s=0.1, check_interval_s=0.2))
    answers: list[Resolution] = []

    class FenceListener:
        def execute_local_transaction(self, message, arg):  # type: ignore[no-untyped-def]
            raise AssertionError("not used")

        def check_local_transaction(self, message):  # type: ignore[no-untyped-def]
            answers.append(check_transaction(engine, message.properties[TRANSACTION_ID_PROPERTY], "pg",
                                             lock_timeout_ms=100))
            return answers[-1]

    try:
        producer = Producer(broker, "pg")
        producer.register_check_listener(FenceListener())
        with engine.connect() as conn:
            transaction = conn.begin()
            record_committed(conn, "t4", "pg")
            producer.send_half(Message("order.paid", b"{}"), "t4")
            deadline = time.monotonic() + 60
            while answers.count(Resolution.UNKNOWN) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert broker.transaction_state("t4") is TransactionState.PENDING
            transaction.commit()
        deadline = time.monotonic() + 60
        while broker.transaction_state("t4") is TransactionState.PENDING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.transaction_state("t4") is TransactionState.COMMITTED
        assert answers.count(Resolution.UNKNOWN) >= 2 and answers[-1] is Resolution.COMMIT
    finally:
        broker.close()
