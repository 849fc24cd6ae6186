"""The fenced transaction_log: what makes every check-back answer final (ORM-free).

* The producer inserts its row (COMMITTED) as the first statement of its local
  transaction, so the row's key is held until that transaction ends.
* The checker inserts a ROLLED_BACK row for the same id if absent, waiting at most a lock
  timeout, then reads the row:
  - the local transaction is still running: the insert waits for it; its commit makes the
    answer COMMIT, its rollback lets the fence in and the answer is ROLLBACK;
  - the local transaction has not started: the fence wins, and that transaction fails on
    its own insert (``TransactionFencedError``), so it never commits after the broker was
    told ROLLBACK;
  - the lock timeout expires: UNKNOWN, and the broker checks again later.

No answer depends on clocks. PostgreSQL: ``SET LOCAL lock_timeout`` and
``statement_timeout`` in the checker's transaction (a statement that outlives either
answers UNKNOWN). SQLite: the busy timeout of the checker's own connection. The
statements are in ``outbox.sql``; the integrations run them on their connections
(``outbox.integrations.sqlalchemy.fence``, ``outbox.integrations.django.fence``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker_embedded import Resolution

from . import instrumentation
from .errors import TransactionFencedError
from .schema import COMMITTED, ROLLED_BACK
from .sql import Execute, OutboxSQL, is_timeout

log = logging.getLogger("outbox.fence")

DEFAULT_LOCK_TIMEOUT_MS = 2000
DEFAULT_STATEMENT_TIMEOUT_MS = 5000


def row_params(transaction_id: str, producer_group: str, state: str) -> tuple[object, ...]:
    """The parameters of ``record_transaction`` and ``fence``, in their order (the row's
    ``created_at`` is the database's clock)."""
    return transaction_id, producer_group, state


def fenced_error(transaction_id: str, producer_group: str) -> TransactionFencedError:
    """The producer's insert found the checker's fence: announced as ``TRANSACTION_FENCED``."""
    instrumentation.announce(instrumentation.TRANSACTION_FENCED, producer_group=producer_group,
                             transaction_id=transaction_id)
    return TransactionFencedError(
        f"transaction {transaction_id} was fenced by a check-back (answered ROLLBACK); it has been rolled back"
    )


def resolution_of(state: str) -> Resolution:
    """The check-back answer a transaction_log state means."""
    return Resolution.COMMIT if state == COMMITTED else Resolution.ROLLBACK


def fence_and_read(execute: Execute, sql: OutboxSQL, transaction_id: str, producer_group: str,
                   lock_timeout_ms: int, statement_timeout_ms: int) -> Resolution:
    """The check-back, inside the checker's freshly begun transaction: timeouts, the fence,
    then the row's state as a Resolution."""
    for statement in sql.transaction_setup(lock_timeout_ms, statement_timeout_ms):
        execute(statement, ())
    execute(sql.fence, row_params(transaction_id, producer_group, ROLLED_BACK))
    (row,) = execute(sql.read_state, (transaction_id,))
    resolution = resolution_of(row[0])
    log.info("check of %s (group %s): %s", transaction_id, producer_group, resolution.value)
    return resolution


def unknown_on_timeout(transaction_id: str, check: Callable[[], Resolution]) -> Resolution:
    """``check()``, or UNKNOWN if the database's lock or statement timeout cut it short."""
    try:
        return check()
    except Exception as exc:
        if not is_timeout(exc):
            raise
        log.info("check of %s: %s; answering UNKNOWN", transaction_id, str(exc).partition("\n")[0])
        return Resolution.UNKNOWN
