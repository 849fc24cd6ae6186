"""A producer answers its own group's check-backs through the fence while it runs, with no
Celery worker: the decorator and ``install`` wire it from the session factory's engine.

A transaction whose END never reached the broker is set up as a crash leaves it: the half
message is stored and the database holds its committed transaction_log row (COMMIT is the
only right answer), or holds nothing (the fence must win: ROLLBACK)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from broker_embedded import BrokerClient, Message, TransactionState
from outbox import AsyncProducer, Producer, install, transactional_message
from outbox.integrations.sqlalchemy.check_back import answer_check_backs
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import transaction_log
from outbox.schema import ROLLED_BACK

from .async_support import async_url, tcp_broker
from .test_crash_recovery import _wait


def orphans(url: str, engine: Engine, group: str) -> tuple[str, str]:
    """Two transactions of ``group`` left by crashed calls: one committed in ``engine``'s
    database, one whose local transaction never committed."""
    with BrokerClient(url) as client:
        for tx in ("committed-1", "absent-1"):
            client.send_half(Message("order.paid", b"{}"), producer_group=group, transaction_id=tx)
    with engine.begin() as conn:
        record_committed(conn, "committed-1", group)
    return "committed-1", "absent-1"


def assert_settled(url: str, engine: Engine, committed: str, absent: str) -> None:
    with BrokerClient(url) as client:
        _wait(lambda: client.transaction_state(committed) is TransactionState.COMMITTED, 30, "COMMIT")
        _wait(lambda: client.transaction_state(absent) is TransactionState.ROLLED_BACK, 30, "ROLLBACK")
    with engine.connect() as conn:  # the fence's row: that transaction can never commit now
        state = conn.scalar(select(transaction_log.c.state).where(transaction_log.c.transaction_id == absent))
    assert state == ROLLED_BACK


def test_the_decorators_producer_answers_its_groups_check_backs(tmp_path: Path, engine: Engine) -> None:
    server = tcp_broker(tmp_path / "broker", check_after_s=0.3)
    try:
        committed, absent = orphans(server.url, engine, "shop")
        producer = Producer(server.url, "shop")  # a restarted process of the group

        @transactional_message(producer, sessionmaker(engine), topic="order.paid")
        def pay(session, order_id: str) -> None:
            pass

        assert producer.answers_check_backs
        assert_settled(server.url, engine, committed, absent)
        producer.close()
    finally:
        server.stop()


def test_install_on_a_sessionmaker_answers_too_and_only_once(tmp_path: Path, engine: Engine) -> None:
    server = tcp_broker(tmp_path / "broker", check_after_s=0.3)
    try:
        committed, absent = orphans(server.url, engine, "shop")
        producer = Producer(server.url, "shop")
        install(sessionmaker(engine), producer)
        assert not answer_check_backs(producer, engine)  # already answering: nothing changes
        assert_settled(server.url, engine, committed, absent)
        producer.close()
    finally:
        server.stop()


def test_the_async_decorators_producer_answers_its_groups_check_backs(tmp_path: Path, engine: Engine,
                                                                      db_url: str) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    server = tcp_broker(tmp_path / "broker", check_after_s=0.3)
    try:
        committed, absent = orphans(server.url, engine, "shop")
        async_engine = create_async_engine(async_url(db_url))

        async def run() -> None:
            producer = AsyncProducer(server.url, "shop")

            @transactional_message(producer, async_sessionmaker(async_engine), topic="order.paid")
            async def pay(session, order_id: str) -> None:
                pass

            await producer.offer_check_backs()  # at start-up; the first call would do it too
            await asyncio.to_thread(assert_settled, server.url, engine, committed, absent)
            await producer.aclose()
            await async_engine.dispose()

        asyncio.run(run())
    finally:
        server.stop()


def test_a_factory_whose_database_cannot_be_told_is_logged_and_answers_nothing(
        engine: Engine, broker, caplog) -> None:
    producer = Producer(broker, "shop")

    @transactional_message(producer, lambda: sessionmaker(engine)(), topic="order.paid")
    def pay(session, order_id: str) -> None:
        pass

    assert not producer.answers_check_backs
    assert "answers no check-backs; call outbox.integrations.sqlalchemy.check_back.answer_check_backs" in caplog.text
    assert answer_check_backs(producer, engine)  # the explicit way
    assert producer.answers_check_backs
