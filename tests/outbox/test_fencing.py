"""Every interleaving of a check-back with the local transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine

from broker_embedded import Resolution
from outbox import TransactionFencedError, check_transaction
from outbox.transaction_log import record_committed


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
