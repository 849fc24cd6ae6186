"""SIGKILL an asyncio producer at the dangerous points (``test_crash_recovery``'s scenario,
with ``AsyncProducer``, an async engine and the async decorator); a real Celery worker's
check-back settles it."""

from __future__ import annotations

import pytest

from broker_embedded import TransactionState

from .test_crash_recovery import crash_and_recover

ASYNC_PRODUCER = r"""
import asyncio, os, signal
from sqlalchemy import event
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session
from outbox import AsyncProducer, transactional_message
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.session import current_transaction_id

crash = os.environ["CRASH"]
sessions = async_sessionmaker(create_async_engine(os.environ["OUTBOX_ASYNC_DATABASE_URL"]))

def die(session):
    print(current_transaction_id(session), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if crash == "after_commit":
    # Runs before the outbox's own listener: the DB has committed, COMMIT is not sent.
    event.listen(Session, "after_commit", die)

async def main():
    # The half message overlaps the transaction, and is acknowledged before the commit.
    @transactional_message(AsyncProducer(os.environ["OUTBOX_BROKER_URL"], "shop"), sessions,
                           topic="order.paid", overlap=crash == "after_commit")
    async def pay(session, order_id):
        if crash == "before_commit":
            die(session.sync_session)

    await pay("o1")

asyncio.run(main())
"""


@pytest.mark.slow
def test_killed_after_db_commit_is_delivered_exactly_once_via_check_back(tmp_path, db_url) -> None:
    state, bodies, db_states = crash_and_recover(tmp_path, db_url, "filesystem://", "after_commit",
                                                 ASYNC_PRODUCER)
    assert db_states == ["COMMITTED"]
    assert state is TransactionState.COMMITTED
    assert bodies == [b'{"order_id":"o1"}']


@pytest.mark.slow
def test_killed_before_db_commit_is_never_delivered(tmp_path) -> None:
    state, bodies, db_states = crash_and_recover(tmp_path, f"sqlite:///{tmp_path / 'shop.sqlite3'}",
                                                 "filesystem://", "before_commit", ASYNC_PRODUCER)
    assert db_states == ["ROLLED_BACK"]  # the checker's fence
    assert state is TransactionState.ROLLED_BACK
    assert bodies == []
