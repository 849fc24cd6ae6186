"""``python -m example_shop.member --port N``: consume ``order.paid`` and award points.

Environment: ``SHOP_MEMBER_DATABASE_URL`` (default a SQLite file in ``SHOP_WORK_DIR``),
``OUTBOX_BROKER_URL``, and for the demo's fault ``SHOP_MEMBER_CRASH_AT=N``: SIGKILL this
process in the middle of handling its N-th message (after the writes, before the commit),
once (a marker file remembers it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sqlalchemy import create_engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from outbox import ReceivedMessage, connect, idempotent_consumer, message_json, run_consumer
from outbox.consumer import stop_on_signals
from outbox.integrations.sqlalchemy.tables import metadata as outbox_metadata
from outbox.settings import DEFAULT_BROKER_URL

from .models import MemberBase, MemberPoints, PointsAward

log = logging.getLogger("example_shop.member")
GROUP = "member-service"


def sqlite_ready(engine) -> None:  # type: ignore[no-untyped-def]
    """WAL and a generous busy timeout, for a SQLite file shared with the demo's reads."""
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _):  # type: ignore[no-untyped-def]
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute("PRAGMA busy_timeout=20000")


def make_handler(factory: sessionmaker[Session], crash_at: int, marker: Path):  # type: ignore[no-untyped-def]
    seen = 0

    @idempotent_consumer(GROUP, factory)
    def award_points(session: Session, received: ReceivedMessage) -> None:
        nonlocal seen
        order = message_json(received.message)
        points = session.get(MemberPoints, order["customer"])
        if points is None:
            session.add(MemberPoints(customer=order["customer"], points=order["amount"]))
        else:
            points.points += order["amount"]
        session.add(PointsAward(order_id=order["order_id"], customer=order["customer"],
                                points=order["amount"], message_id=received.message.message_id))
        session.flush()
        seen += 1
        if crash_at and seen == crash_at and not marker.exists():
            marker.touch()
            log.warning("fault injected: killed in the middle of handling %s", order["order_id"])
            os.kill(os.getpid(), signal.SIGKILL)

    return award_points


def serve_state(factory: sessionmaker[Session], port: int) -> ThreadingHTTPServer:
    """``GET /points``: each customer's points, as JSON."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            with factory() as session:
                rows = {p.customer: p.points for p in session.scalars(select(MemberPoints))}
            body = json.dumps({"points": rows}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(prog="example_shop.member")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = Path(os.environ.get("SHOP_WORK_DIR", "demo-work")).resolve()
    url = os.environ.get("SHOP_MEMBER_DATABASE_URL", f"sqlite:///{work / 'member.sqlite3'}")
    engine = create_engine(url)
    sqlite_ready(engine)
    MemberBase.metadata.create_all(engine)
    outbox_metadata.create_all(engine)
    factory = sessionmaker(engine)
    handler = make_handler(factory, int(os.environ.get("SHOP_MEMBER_CRASH_AT", "0")), work / "member-crashed")
    http = serve_state(factory, args.port)
    broker = connect(os.environ.get("OUTBOX_BROKER_URL", DEFAULT_BROKER_URL))
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        run_consumer(broker, GROUP, "order.paid", handler, stop, invisible_duration_s=5.0, wait_s=1.0)
    finally:
        http.shutdown()
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
