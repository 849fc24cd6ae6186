"""The check service: asks about transactions left pending past their timeout.

Each round takes the pending transactions whose check is due from the book's heap
(O(due), never O(all)). One checked ``check_max`` times is parked; any other is handed to
the checker, bounded by ``max_outstanding`` (back-pressure), and its check count is made
durable as a check op. A checker with no route (returns False) costs no count. A
transaction with a check in flight is not asked again until that check's interval is over;
a resolved one is never asked again (it has left the book).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..api import TransactionChecker
from ..message import CheckRequest, Message
from .book import Transaction, TransactionBook

log = logging.getLogger("broker_embedded.transactions")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CheckService:
    """Runs check rounds over ``book``; the transaction service supplies the writes."""

    def __init__(
        self,
        book: TransactionBook,
        checker: Callable[[], TransactionChecker],
        first_message: Callable[[Transaction], Message],
        write_check: Callable[[Transaction, int], None],
        park: Callable[[Transaction], None],
        check_interval_s: float,
        check_max: int,
        max_outstanding: int,
    ) -> None:
        self.book = book
        self.checker = checker
        self.first_message = first_message
        self.write_check = write_check
        self.park = park
        self.check_interval_ms = int(check_interval_s * 1000)
        self.check_max = check_max
        self.max_outstanding = max_outstanding
        self.checks_sent = 0
        self._outstanding: dict[str, float] = {}  # transaction id -> monotonic deadline

    def outstanding(self) -> int:
        """Checks sent and not yet answered within their interval."""
        now = time.monotonic()
        for tx_id, deadline in list(self._outstanding.items()):
            if deadline <= now:
                self._outstanding.pop(tx_id, None)
        return len(self._outstanding)

    def answered(self, transaction_id: str) -> None:
        """A check answer arrived (any resolution, UNKNOWN included): free its slot."""
        self._outstanding.pop(transaction_id, None)

    def run_once(self) -> None:
        """One round over the due transactions."""
        free = self.max_outstanding - self.outstanding()
        if free <= 0:
            log.warning("check back-pressure: %d checks outstanding", self.max_outstanding - free)
            return
        for tx in self.book.pop_due(now_ms(), free):
            deadline = self._outstanding.get(tx.transaction_id)
            if deadline is not None and deadline > time.monotonic():
                self.book.reschedule(tx, now_ms() + int((deadline - time.monotonic()) * 1000))
            elif tx.check_times >= self.check_max:
                self.park(tx)
            else:
                self._check(tx)

    def _check(self, tx: Transaction) -> None:
        self._outstanding[tx.transaction_id] = time.monotonic() + self.check_interval_ms / 1000
        request = CheckRequest(
            producer_group=tx.producer_group,
            transaction_id=tx.transaction_id,
            message=self.first_message(tx),
            check_times=tx.check_times + 1,
        )
        log.info("check-back %d/%d for transaction %s (group %s)",
                 request.check_times, self.check_max, tx.transaction_id, tx.producer_group)
        try:
            routed = self.checker().request_check(request)
        except Exception:
            log.exception("checker failed for transaction %s", tx.transaction_id)
            routed = False
        self.book.reschedule(tx, now_ms() + self.check_interval_ms)
        if not routed:  # no route: this round does not count; try again next interval
            self._outstanding.pop(tx.transaction_id, None)
            log.info("no checker route for transaction %s (group %s)", tx.transaction_id, tx.producer_group)
            return
        self.write_check(tx, request.check_times)
        self.checks_sent += 1
