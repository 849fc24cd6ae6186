"""The Celery checker without a worker: enqueueing never blocks the broker for long, and
the task answers UNKNOWN (sends nothing) while the group's database is down."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker_embedded import CheckRequest, Message, TransactionState
from outbox.integrations.celery import app as celery_app
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.checker import CeleryChecker
from outbox.settings import OutboxSettings


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _request(transaction_id: str = "tx-1") -> CheckRequest:
    return CheckRequest(producer_group="shop", transaction_id=transaction_id,
                        message=Message("order.paid", b"{}"), check_times=1)


def test_filesystem_transport_queues_the_task_for_the_group(tmp_path: Path) -> None:
    app = make_app(OutboxSettings(celery_data_dir=tmp_path / "celery"))
    assert CeleryChecker(app).request_check(_request()) is True
    queued = list((tmp_path / "celery" / "queue").iterdir())
    assert len(queued) == 1
    text = queued[0].read_text()
    assert "outbox.check_transaction" in text and "outbox.check.shop" in text


def test_unreachable_transport_answers_false_instead_of_hanging() -> None:
    app = make_app(OutboxSettings(celery_broker_url=f"redis://127.0.0.1:{_closed_port()}/0"))
    assert CeleryChecker(app).request_check(_request()) is False


def test_task_answers_unknown_while_the_database_is_down(monkeypatch, broker) -> None:
    down = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/shop"
    monkeypatch.setattr(celery_app, "settings", OutboxSettings(database_url=down, broker_url="unused://"))
    broker.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id="tx-down")
    assert celery_app.check_transaction_task("shop", "tx-down", "m") == "unknown"
    assert broker.transaction_state("tx-down") is TransactionState.PENDING


@pytest.mark.parametrize("committed", [True, False])
def test_task_answers_by_the_fence_and_tells_the_broker(monkeypatch, broker, engine, committed: bool) -> None:
    from outbox.transaction_log import record_committed

    monkeypatch.setattr(celery_app, "settings", OutboxSettings(database_url=str(engine.url.render_as_string(
        hide_password=False))))
    monkeypatch.setattr(celery_app, "_broker", lambda url: broker)
    broker.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id="tx-t")
    if committed:
        with engine.begin() as conn:
            record_committed(conn, "tx-t", "shop")
    assert celery_app.check_transaction_task("shop", "tx-t") == ("commit" if committed else "rollback")
    expected = TransactionState.COMMITTED if committed else TransactionState.ROLLED_BACK
    assert broker.transaction_state("tx-t") is expected
