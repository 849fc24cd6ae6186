"""The Celery checker and the check task without a worker: enqueueing never blocks the broker
for long, tasks carry their expiry, and the task registered in any app answers by the fence
(UNKNOWN, sending nothing, while the group's database is down)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from broker_embedded import CheckRequest, EmbeddedBroker, Message, Resolution, TransactionState
from outbox.integrations.celery import CHECK_TASK, register
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.check_back import broker_client
from outbox.integrations.celery.checker import MIN_EXPIRY_S, CeleryChecker, make_checker
from outbox.settings import OutboxSettings
from tests.ports import free_port


def _request(transaction_id: str = "tx-1") -> CheckRequest:
    return CheckRequest(producer_group="shop", transaction_id=transaction_id,
                        message=Message("order.paid", b"{}"), check_times=1)


def _queued(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in (folder / "queue").iterdir()]


def test_filesystem_transport_queues_the_task_for_the_group(tmp_path: Path) -> None:
    app = make_app(OutboxSettings(celery_data_dir=tmp_path / "celery"))
    assert CeleryChecker(app).request_check(_request()) is True
    [queued] = _queued(tmp_path / "celery")
    assert queued["headers"]["task"] == CHECK_TASK and queued["headers"]["expires"] is None
    assert queued["properties"]["delivery_info"]["routing_key"] == "outbox.check.shop"


def test_a_check_task_expires_after_two_check_intervals(tmp_path: Path, broker: EmbeddedBroker) -> None:
    checker = make_checker(broker)
    assert checker.expires_s == max(2 * broker.config.check_interval_s, MIN_EXPIRY_S)
    checker.app = make_app(OutboxSettings(celery_data_dir=tmp_path / "celery"))
    assert checker.request_check(_request()) is True
    [queued] = _queued(tmp_path / "celery")
    assert queued["headers"]["expires"] is not None


def test_a_non_positive_expiry_is_refused() -> None:
    with pytest.raises(ValueError, match="expires_s"):
        CeleryChecker(Celery("x"), expires_s=0)


def test_unreachable_transport_answers_false_instead_of_hanging() -> None:
    app = make_app(OutboxSettings(celery_broker_url=f"redis://127.0.0.1:{free_port()}/0"))
    assert CeleryChecker(app).request_check(_request()) is False


@pytest.fixture
def broker_url(tmp_path: Path) -> Iterator[str]:
    """An embedded broker that only the task opens (through ``broker_client``)."""
    url = f"embedded://{tmp_path / 'broker'}"
    yield url
    if broker_client.cache_info().currsize:
        broker_client(url).close()  # type: ignore[attr-defined]
        broker_client.cache_clear()


def test_task_answers_unknown_while_the_database_is_down(broker_url: str) -> None:
    down = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/shop"
    task = register(Celery("user"), settings=OutboxSettings(database_url=down, broker_url=broker_url))
    broker = broker_client(broker_url)
    broker.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id="tx-down")
    assert task("shop", "tx-down", "m") == "unknown"
    assert broker.transaction_state("tx-down") is TransactionState.PENDING


@pytest.mark.parametrize("committed", [True, False])
def test_task_answers_by_the_fence_and_tells_the_broker(broker_url: str, engine, committed: bool) -> None:
    from outbox.integrations.sqlalchemy.recorder import record_committed

    settings = OutboxSettings(database_url=engine.url.render_as_string(hide_password=False), broker_url=broker_url)
    task = register(Celery("user"), settings=settings)
    broker = broker_client(broker_url)
    broker.send_half(Message("order.paid", b"{}"), producer_group="shop", transaction_id="tx-t")
    if committed:
        with engine.begin() as conn:
            record_committed(conn, "tx-t", "shop")
    assert task("shop", "tx-t") == ("commit" if committed else "rollback")
    expected = TransactionState.COMMITTED if committed else TransactionState.ROLLED_BACK
    assert broker.transaction_state("tx-t") is expected


def test_register_takes_the_answer_it_is_given(broker_url: str) -> None:
    asked: list[tuple[str, str]] = []

    def answer(transaction_id: str, producer_group: str) -> Resolution:
        asked.append((transaction_id, producer_group))
        return Resolution.ROLLBACK

    app = Celery("user")
    task = register(app, answer=answer, settings=OutboxSettings(broker_url=broker_url))
    assert app.tasks[CHECK_TASK].name == task.name == CHECK_TASK
    broker_client(broker_url).send_half(Message("order.paid", b"{}"), producer_group="g", transaction_id="tx-a")
    assert task("g", "tx-a") == "rollback"
    assert asked == [("tx-a", "g")]
    assert broker_client(broker_url).transaction_state("tx-a") is TransactionState.ROLLED_BACK
