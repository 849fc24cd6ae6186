"""The SQLAlchemy session hook: messages that follow the session's transaction.

``install(session_class_or_factory, producer)`` registers the events once. Then
``send(session, message)`` inside a transaction sends a half message; the first call of
a transaction also generates its id and inserts the transaction_log row (COMMITTED),
so the row is written after the half message and before the commit. The half message's
acknowledgment is not waited for there (``Producer.start_half``): the ``before_commit``
event flushes the session and then waits for its transaction's halves, so a half the
broker did not store fails the commit with ``BrokerUnavailableError`` (the transaction
rolls back and ROLLBACK is sent). Asyncio: install an
``AsyncProducer`` on an ``async_sessionmaker`` or ``AsyncSession`` and
``await asend(session, message)``; the same events end the transaction, starting its
END_TRANSACTION as a task of the loop (``AsyncProducer.finish``). The
``after_commit`` event sends COMMIT; ``after_rollback`` (the real database rollback)
sends ROLLBACK, and so does the end of a root transaction that neither committed nor
rolled back through those events (``session.close()`` with a transaction open). ``after_soft_rollback`` is not needed: a session whose transaction a
failed flush deactivated has already rolled back on the database and fired
``after_rollback``.

Store mode (a producer made with ``on_broker_down="store"``, ``outbox.stored``): a half
the broker did not take makes ``before_commit`` write all of the transaction's messages
into ``outbox_stored_message`` in the same transaction instead of failing the commit; a
message whose message group has stored messages waiting is held out of the broker
(``start_half``), so the whole transaction stores behind them. No END follows the commit;
the relay (``outbox.relay``) hands the messages over.

Savepoints: messages belong to the outermost transaction, whose one transaction id they
share, and the broker resolves a transaction as a whole. So:

* the first message of a transaction must be sent outside any SAVEPOINT
  (``SavepointError`` at once), because rolling that savepoint back would remove the
  transaction_log row while the outer transaction commits;
* a SAVEPOINT that sent messages and is rolled back (itself or an enclosing savepoint)
  poisons the transaction: its messages describe writes that were undone and cannot be
  withdrawn one by one, so the outer commit raises ``SavepointError`` and the whole
  transaction rolls back (ROLLBACK). A savepoint that is released keeps its messages.
  Send messages after the risky savepoint, or outside it, to keep commits possible.

The same holds for a ``@transactional_message`` call that joined the transaction (it was
given the session) and raised: its message is out, so the outer commit raises
``NestedTransactionError`` and rolls back (``poisons``). The hook also notes which
sessions hold a database transaction in which thread and asyncio task
(``transaction_elsewhere``), so the decorator can refuse to open a second one beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, event
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, SessionTransaction

from broker_embedded import Message, Resolution

from ... import instrumentation
from ...aio_producer import AsyncProducer
from ...context import SESSION_INFO_KEY, LocalTransaction
from ...context import current_transaction_id as current_transaction_id  # the session's, given one
from ...errors import ConfigurationError, NestedTransactionError, OutboxError, SavepointError
from ...producer import Producer, new_transaction_id
from ...producer_protocol import local_transaction as local_operation
from ...stored import store_messages
from .check_back import answer_own_check_backs
from .recorder import RECORDER, record_committed

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger(__name__)

_PRODUCER_KEY = "halfmoon.producer"


@dataclass
class PendingTransaction(LocalTransaction):
    """What a session's current transaction has sent."""

    #: The savepoints that were open when a message was sent (a rollback of any poisons).
    savepoints: list[SessionTransaction] = field(default_factory=list)
    #: Set when such a savepoint rolled back, or a joined call raised: the commit must fail.
    poisoned: OutboxError | None = None
    #: The ``LOCAL_TRANSACTION`` operation, from the first message to the end.
    operation: instrumentation.Operation | None = None

    def end(self, resolution: Resolution) -> None:
        """The local transaction ended with ``resolution``: END_TRANSACTION."""
        if self.operation is not None:
            self.operation.end(outcome=resolution.value)
        self.producer.finish(self.transaction_id, resolution)


def install(target: Any, producer: Producer | AsyncProducer) -> None:
    """Make sessions of ``target`` (a ``sessionmaker`` or a ``Session``; with an
    ``AsyncProducer``, an ``async_sessionmaker`` or an ``AsyncSession``) send
    COMMIT/ROLLBACK with ``producer`` when their transaction ends. Given a bound
    ``sessionmaker``, the producer also answers its group's check-backs on its engine
    (``check_back.answer_own_check_backs``)."""
    if isinstance(target, Session) or isinstance(getattr(target, "sync_session", None), Session):
        target.info[_PRODUCER_KEY] = producer
    else:
        info = getattr(target, "kw", {}).setdefault("info", {}) if hasattr(target, "kw") else None
        if info is None:
            raise ConfigurationError("install() takes a sessionmaker or a Session (or their async kinds)")
        info[_PRODUCER_KEY] = producer
        answer_own_check_backs(producer, target)
    listen()


_listening = False  # whether listen() registered the events


def listen() -> None:
    """Register the session events (once per process; each decorated call asks again)."""
    global _listening
    if _listening:
        return
    _listening = True
    event.listen(Session, "after_begin", _after_begin)
    event.listen(Session, "before_commit", _before_commit)
    event.listen(Session, "after_commit", _after_commit)
    event.listen(Session, "after_rollback", _after_rollback)
    event.listen(Session, "after_soft_rollback", _after_soft_rollback)
    event.listen(Session, "after_transaction_end", _after_transaction_end)


def installed_producer(session: Session) -> Producer | AsyncProducer | None:
    """The producer ``install`` gave the session (or its sessionmaker), if any."""
    producer: Producer | AsyncProducer | None = session.info.get(_PRODUCER_KEY)
    return producer


Database = tuple[str, str | None, int | None, str | None]

#: Sessions holding a database transaction: the thread and task that began it, and where.
_open: weakref.WeakKeyDictionary[Session, tuple[tuple[int, object], Database]] = weakref.WeakKeyDictionary()
_open_lock = threading.Lock()


def database(url: URL) -> Database:
    """What tells two engines' databases apart (not the driver: asyncpg and psycopg agree)."""
    return url.get_backend_name(), url.host, url.port, url.database


def _owner() -> tuple[int, object]:
    """This thread, and this asyncio task if one runs (SQLAlchemy's async events run in it)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), task


def transaction_elsewhere(session: Session, where: Database) -> Session | None:
    """Another session that this thread (and task) began a transaction in on database
    ``where`` and that is still in it: a second transaction beside it would wait for its
    locks (SQLite) or commit apart from it (PostgreSQL)."""
    owner = _owner()
    with _open_lock:
        candidates = list(_open.items())
    for other, ((thread, task), other_where) in candidates:
        if (other is not session and thread == owner[0] and task is owner[1] and other_where == where
                and other.in_transaction()):
            return other
    return None


def _after_begin(session: Session, _transaction: SessionTransaction, connection: Connection) -> None:
    with _open_lock:
        _open[session] = (_owner(), database(connection.engine.url))


@contextlib.contextmanager
def poisons(pending: PendingTransaction, call: str) -> Iterator[None]:
    """``call``, which joined ``pending`` after sending its half message, raised: the
    transaction cannot commit (its message cannot be withdrawn alone)."""
    try:
        yield
    except BaseException as exc:
        if pending.poisoned is None:
            pending.poisoned = NestedTransactionError(
                f"transaction {pending.transaction_id}: {call} raised {type(exc).__name__} after sending its "
                "message, which cannot be withdrawn alone, so the whole transaction must roll back")
        raise


def send(session: Session, message: Message) -> str:
    """Send ``message`` as part of the session's transaction; returns the transaction id."""
    pending = pending_transaction(session)
    if not isinstance(pending.producer, Producer):
        raise ConfigurationError("this session's producer is an AsyncProducer: await outbox.asend(session, message)")
    start_half(session, pending, message)
    record_message(session, pending, message)
    return pending.transaction_id


async def asend(session: AsyncSession, message: Message) -> str:
    """``send`` for an ``AsyncSession`` whose producer is an ``AsyncProducer``: the half
    message, then (first message) the transaction_log row; returns the transaction id."""
    pending = pending_transaction(session.sync_session)
    if not isinstance(pending.producer, AsyncProducer):
        raise ConfigurationError("asend() needs an AsyncProducer installed; a Producer sends with outbox.send")
    await session.run_sync(start_half, pending, message)
    await awaited(pending)
    await session.run_sync(record_message, pending, message)
    return pending.transaction_id


def start_half(session: Session, pending: PendingTransaction, message: Message) -> None:
    """``message``'s half message on its way, or in store mode held for the database
    (``LocalTransaction.start``)."""
    pending.start(message, lambda: RECORDER.statements(session))


def acknowledged(pending: PendingTransaction) -> None:
    """Wait for the acknowledgments of the transaction's half messages (``Producer``); in
    store mode one that was not taken makes the commit store its messages."""
    pending.answered(cast(Producer, pending.producer).await_halves(pending.transaction_id))


async def awaited(pending: PendingTransaction) -> None:
    """``acknowledged`` for an ``AsyncProducer``, before the commit: the halves under way."""
    pending.answered(await cast(AsyncProducer, pending.producer).await_halves(pending.transaction_id))


def pending_transaction(session: Session) -> PendingTransaction:
    """The session's transaction that sends messages: the current one, or a new one (with
    a new id) that ``record_message`` opens after its first half message is sent."""
    pending: PendingTransaction | None = session.info.get(SESSION_INFO_KEY)
    if pending is not None:
        return pending
    producer: Producer | AsyncProducer | None = session.info.get(_PRODUCER_KEY)
    if producer is None:
        raise ConfigurationError("call outbox.integrations.sqlalchemy.install(...) for this session first")
    if session.get_nested_transaction() is not None:
        raise SavepointError("send the first message of a transaction outside any SAVEPOINT")
    return PendingTransaction(new_transaction_id(), producer)


def record_message(session: Session, pending: PendingTransaction, message: Message) -> None:
    """After ``message``'s half was sent: the first one opens the transaction (the
    transaction_log row); later ones note the savepoints they were sent in."""
    if session.info.get(SESSION_INFO_KEY) is not pending:
        session.info[SESSION_INFO_KEY] = pending
        pending.operation = local_operation(pending.producer.producer_group, pending.transaction_id)
        record_committed(session, pending.transaction_id, pending.producer.producer_group)
    else:
        savepoint = session.get_nested_transaction()
        while savepoint is not None and savepoint.nested:
            if not any(savepoint is known for known in pending.savepoints):
                pending.savepoints.append(savepoint)
            savepoint = savepoint.parent
    pending.messages.append(message)


def local_transaction(session: Session) -> PendingTransaction:
    """The session's current transaction, which has sent a message."""
    pending: PendingTransaction | None = session.info.get(SESSION_INFO_KEY)
    if pending is None:
        raise ConfigurationError("the session's transaction has sent no message yet")
    return pending


def _finish(session: Session, resolution: Resolution) -> None:
    if session.in_nested_transaction():
        return  # a SAVEPOINT ended; the messages follow the outermost transaction
    pending: PendingTransaction | None = session.info.pop(SESSION_INFO_KEY, None)
    if pending is not None:
        pending.end(resolution)


def _before_commit(session: Session) -> None:
    pending: PendingTransaction | None = session.info.get(SESSION_INFO_KEY)
    if pending is None or session.get_nested_transaction() is not None:
        return
    if pending.poisoned is not None:
        raise pending.poisoned
    if isinstance(pending.producer, Producer):
        session.flush()  # the business writes travel while the halves' acknowledgments are awaited
        acknowledged(pending)
    if pending.stores:  # all of the transaction's messages, or (rolled back with it) none
        execute, sql = RECORDER.statements(session)
        store_messages(execute, sql, pending.transaction_id, pending.producer.producer_group, pending.messages)


def _after_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    pending: PendingTransaction | None = session.info.get(SESSION_INFO_KEY)
    if pending is not None and previous.nested and any(previous is s for s in pending.savepoints):
        pending.poisoned = pending.poisoned or SavepointError(
            f"transaction {pending.transaction_id} sent message(s) in a SAVEPOINT that rolled back; "
            "they cannot be withdrawn alone, so the whole transaction must roll back"
        )


def _after_commit(session: Session) -> None:
    _finish(session, Resolution.COMMIT)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    """The catch-all: a root transaction that ended without ``after_commit`` or
    ``after_rollback`` resolving its messages (``session.close()`` with a transaction
    open) rolled back, so it sends ROLLBACK, and the session's next transaction starts
    with a new transaction id."""
    if transaction.parent is None:
        with _open_lock:
            _open.pop(session, None)
        pending: PendingTransaction | None = session.info.pop(SESSION_INFO_KEY, None)
        if pending is not None:
            pending.end(Resolution.ROLLBACK)


def _after_rollback(session: Session) -> None:
    _finish(session, Resolution.ROLLBACK)


