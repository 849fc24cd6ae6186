"""The check service: asks about transactions left pending past their timeout.

Each round takes the pending transactions whose check is due from the book's heap
(O(due), never O(all)). One checked ``check_max`` times is parked; any other is handed to
the checker, bounded by ``max_outstanding`` (back-pressure), and its check count is made
durable as a check op. A check no checker took (no route: no connected producer of the
group and no other checker) counts as well, so an orphan parks after ``check_max`` checks
instead of being checked forever. A
transaction with a check in flight is not asked again until that check's interval is over;
a resolved one is never asked again (it has left the book). A transaction that cannot be
committed (an unusable, damaged or lost half message) is parked at once, never checked.

``ask_now`` is the operator's check of a parked transaction: one check-back outside the
rounds, not counted, whose answer the caller waits for.

A producer group whose checks go unanswered (no worker, no connected producer) is not left
quiet: ``UnansweredGroups`` keeps, per group, since when its checks have gone without an
answer; past two check intervals the group is logged at ERROR (once per ``report_every_s``)
and listed in ``BrokerStats.unanswered_check_groups``, until an answer of the group arrives.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future

from ...api import TransactionChecker
from ...clock import WALL, Clock
from ...errors import CheckUnansweredError, CorruptLogError
from ...message import CheckRequest, Message, Resolution
from .book import Transaction, TransactionBook

log = logging.getLogger(__name__)


class UnansweredGroups:
    """Per producer group, since when its checks have gone unanswered: O(groups) state.

    A group is *unanswered* once ``threshold_s`` passed since its oldest check after its
    last answer; an answer clears it. A group none of whose checks was even tried for
    twice ``threshold_s`` (its transactions ended otherwise or were parked) is forgotten."""

    def __init__(self, threshold_s: float, report_every_s: float, clock: Clock = WALL) -> None:
        self.threshold_s = threshold_s
        self.clock = clock
        #: How often an unanswered group is logged at ERROR again.
        self.report_every_s = report_every_s
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}  # group -> monotonic time of its first unanswered check
        self._last_asked: dict[str, float] = {}  # group -> monotonic time of its latest check
        self._reported: dict[str, float] = {}  # group -> monotonic time it was last logged

    def asked(self, producer_group: str) -> None:
        """A check of the group was tried (routed or not)."""
        now = self.clock.monotonic()
        with self._lock:
            self._since.setdefault(producer_group, now)
            self._last_asked[producer_group] = now

    def answered(self, producer_group: str) -> None:
        """A check answer of the group arrived: it has a checker."""
        with self._lock:
            for times in (self._since, self._last_asked, self._reported):
                times.pop(producer_group, None)

    def seconds(self) -> dict[str, float]:
        """Each unanswered group and for how many seconds its checks have gone unanswered."""
        now = self.clock.monotonic()
        with self._lock:
            for group, last in list(self._last_asked.items()):
                if now - last > 2 * self.threshold_s:
                    for times in (self._since, self._last_asked, self._reported):
                        times.pop(group, None)
            return {group: round(now - since, 1) for group, since in self._since.items()
                    if now - since >= self.threshold_s}

    def report(self) -> None:
        """Log each unanswered group at ERROR, at most once per ``report_every_s``."""
        for group, seconds in self.seconds().items():
            now = self.clock.monotonic()
            with self._lock:
                if now - self._reported.get(group, -self.report_every_s) < self.report_every_s:
                    continue
                self._reported[group] = now
            log.error("no checker answered producer group %r for %.0f s: its pending transactions "
                      "stay pending, then park; start a checker for the group (e.g. a Celery worker "
                      "on its check queue)", group, seconds)


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
        clock: Clock = WALL,
    ) -> None:
        self.book = book
        self.clock = clock
        self.checker = checker
        self.first_message = first_message
        self.write_check = write_check
        self.park = park
        self.check_interval_ms = int(check_interval_s * 1000)
        self.check_max = check_max
        self.max_outstanding = max_outstanding
        #: Checks handed to a checker, and those no checker took (no route), since the
        #: broker started; ``answer_counts()`` gives the answers per resolution.
        self.checks_sent = 0
        self.checks_unrouted = 0
        self._answers: Counter[Resolution] = Counter()
        self.unanswered = UnansweredGroups(threshold_s=2 * check_interval_s, report_every_s=60.0, clock=clock)
        self._outstanding: dict[str, float] = {}  # transaction id -> monotonic deadline
        #: (transaction id, producer group) -> the operators' checks waiting for an answer
        self._asked: dict[tuple[str, str], list[Future[Resolution]]] = {}
        self._asked_lock = threading.Lock()

    def answer_counts(self) -> dict[Resolution, int]:
        """Check answers per resolution since the broker started."""
        with self._asked_lock:
            return dict(self._answers)

    def outstanding(self) -> int:
        """Checks sent and not yet answered within their interval."""
        now = self.clock.monotonic()
        for tx_id, deadline in list(self._outstanding.items()):
            if deadline <= now:
                self._outstanding.pop(tx_id, None)
        return len(self._outstanding)

    def answered(self, transaction_id: str, producer_group: str, resolution: Resolution) -> None:
        """A check answer arrived (any resolution, UNKNOWN included): free its slot and hand
        it to the operators' checks waiting for one from that group."""
        self._outstanding.pop(transaction_id, None)
        self.unanswered.answered(producer_group)
        with self._asked_lock:
            self._answers[resolution] += 1
            waiting = self._asked.pop((transaction_id, producer_group), [])
        for answer in waiting:
            answer.set_result(resolution)

    def run_once(self) -> None:
        """One round over the due transactions."""
        free = self.max_outstanding - self.outstanding()
        if free <= 0:
            log.warning("check back-pressure: %d checks outstanding", self.max_outstanding - free)
        else:
            self._round(free)
        self.unanswered.report()

    def _round(self, free: int) -> None:
        for tx in self.book.pop_due(self.clock.time_ms(), free):
            try:
                self._handle(tx)
            except CorruptLogError as exc:  # its half message is damaged or lost (see ``repair``)
                tx.problem = f"half message unreadable: {exc}"
                log.error("transaction %s cannot be checked: %s; parking it", tx.transaction_id, tx.problem)
                self.park(tx)
            except Exception:  # one transaction's failure must not drop the others of the round
                log.exception("check round failed for transaction %s; trying again next interval",
                              tx.transaction_id)
                self.book.reschedule(tx, self.clock.time_ms() + self.check_interval_ms)

    def _handle(self, tx: Transaction) -> None:
        deadline = self._outstanding.get(tx.transaction_id)
        if deadline is not None and deadline > self.clock.monotonic():
            self.book.reschedule(tx, self.clock.time_ms() + int((deadline - self.clock.monotonic()) * 1000))
        elif tx.check_times >= self.check_max or tx.problem:
            self.park(tx)
        else:
            self._check(tx)

    def _request(self, tx: Transaction) -> CheckRequest:
        return CheckRequest(
            producer_group=tx.producer_group,
            transaction_id=tx.transaction_id,
            message=self.first_message(tx),
            check_times=tx.check_times + 1,
        )

    def _route(self, request: CheckRequest) -> bool:
        """Hand ``request`` to the checker; False when it has no route (or failed)."""
        try:
            return self.checker().request_check(request)
        except Exception:
            log.exception("checker failed for transaction %s", request.transaction_id)
            return False

    def _check(self, tx: Transaction) -> None:
        self._outstanding[tx.transaction_id] = self.clock.monotonic() + self.check_interval_ms / 1000
        request = self._request(tx)
        log.info("check-back %d/%d for transaction %s (group %s)",
                 request.check_times, self.check_max, tx.transaction_id, tx.producer_group)
        self.unanswered.asked(tx.producer_group)
        routed = self._route(request)
        self.book.reschedule(tx, self.clock.time_ms() + self.check_interval_ms)
        if routed:
            self.checks_sent += 1
        else:  # nobody to ask: nothing is outstanding, but the check counts toward parking
            self._outstanding.pop(tx.transaction_id, None)
            self.checks_unrouted += 1
            log.info("no checker route for transaction %s (group %s): check %d/%d counted",
                     tx.transaction_id, tx.producer_group, request.check_times, self.check_max)
        self.write_check(tx, request.check_times)

    def ask_now(self, tx: Transaction, wait_s: float) -> Resolution:
        """One check-back for ``tx`` now, outside the rounds and not counted (an operator
        resolving a parked transaction); the checker's answer, UNKNOWN included.
        ``CheckUnansweredError`` when no checker of the group took it or none answered
        within ``wait_s``."""
        key = (tx.transaction_id, tx.producer_group)
        answer: Future[Resolution] = Future()
        with self._asked_lock:  # before the request: an in-process checker answers inside it
            self._asked.setdefault(key, []).append(answer)
        try:
            log.info("operator's check-back for parked transaction %s (group %s)", *key)
            if not self._route(self._request(tx)):
                raise CheckUnansweredError(
                    f"no checker of producer group {tx.producer_group!r} took the check of transaction "
                    f"{tx.transaction_id}; nothing changed"
                )
            try:
                return answer.result(timeout=wait_s)
            except TimeoutError:
                raise CheckUnansweredError(
                    f"no checker of producer group {tx.producer_group!r} answered the check of transaction "
                    f"{tx.transaction_id} within {wait_s:g} s; nothing changed"
                ) from None
        finally:
            with self._asked_lock:
                waiting = self._asked.get(key, [])
                if answer in waiting:
                    waiting.remove(answer)
                if not waiting:
                    self._asked.pop(key, None)
