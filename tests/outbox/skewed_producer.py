"""A producer process whose host clock is wrong: ``python -m tests.outbox.skewed_producer``.

Before anything else is imported, the wall clock of this process is moved by
``CLOCK_SKEW_S`` seconds (``datetime.now``/``utcnow``, ``time.time``/``time_ns``: what any
Python code here reads as "now"), as on a host whose clock is off. It then pays orders
``{PREFIX}-1``, ``{PREFIX}-2``, ... with ``@transactional_message`` (an ``orders`` row and a
message ``{"order_id": ...}`` on ``order.paid``), printing each order id once committed:

* ``ORDERS``: how many (default: until killed); ``PAUSE_S`` between two;
* ``WAIT_FOR_GO=1``: prints ``ready`` and waits for a line on stdin before the first;
* ``KILL_AT=n``: the n-th order's process SIGKILLs itself after its DB commit, before its
  END reaches the broker (the check-back has to settle it); prints the transaction id first.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time

SKEW_S = float(os.environ.get("CLOCK_SKEW_S", "0"))
_SKEW = _datetime.timedelta(seconds=SKEW_S)
_real_time, _real_time_ns = _time.time, _time.time_ns
_RealDatetime = _datetime.datetime


class _SkewedDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
        return _RealDatetime.now(tz) + _SKEW

    @classmethod
    def utcnow(cls) -> _datetime.datetime:  # type: ignore[override]
        return _RealDatetime.now(_datetime.UTC).replace(tzinfo=None) + _SKEW


_time.time = lambda: _real_time() + SKEW_S  # type: ignore[assignment]
_time.time_ns = lambda: _real_time_ns() + int(SKEW_S * 1e9)  # type: ignore[assignment]
_datetime.datetime = _SkewedDatetime  # type: ignore[misc]


def main() -> None:
    import signal
    import sys

    from sqlalchemy import Column, MetaData, String, Table, event, insert
    from sqlalchemy.orm import Session, sessionmaker

    from outbox import Producer, transactional_message
    from outbox.integrations.sqlalchemy.engine import create_engine
    from outbox.integrations.sqlalchemy.session import current_transaction_id

    orders = Table("orders", MetaData(), Column("order_id", String(64), primary_key=True))
    factory = sessionmaker(create_engine(os.environ["OUTBOX_DATABASE_URL"]))
    prefix, kill_at = os.environ.get("PREFIX", "o"), int(os.environ.get("KILL_AT", "0"))
    count, pause_s = int(os.environ.get("ORDERS", "0")), float(os.environ.get("PAUSE_S", "0"))
    number = 0

    def die(session: Session) -> None:
        if number == kill_at:
            print(current_transaction_id(session), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    # Registered before the outbox's own listener, so it runs first: the DB has committed
    # and END has not been sent.
    event.listen(Session, "after_commit", die)

    @transactional_message(Producer(os.environ["OUTBOX_BROKER_URL"], "shop"), factory, topic="order.paid")
    def pay(session: Session, order_id: str) -> None:
        session.execute(insert(orders).values(order_id=order_id))

    if os.environ.get("WAIT_FOR_GO") == "1":
        print("ready", flush=True)
        sys.stdin.readline()
    while not count or number < count:
        number += 1
        pay(f"{prefix}-{number}")
        print(f"{prefix}-{number}", flush=True)
        _time.sleep(pause_s)


if __name__ == "__main__":
    main()
