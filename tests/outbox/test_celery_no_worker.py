"""The broker-side Celery checker says where its check tasks wait when no worker takes them."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from broker_embedded import CheckRequest, Message
from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.checker import CeleryChecker
from outbox.settings import OutboxSettings


def _send_checks(checker: CeleryChecker, seconds: float, drain: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        request = CheckRequest(producer_group="shop", transaction_id=f"tx-{n}",
                               message=Message("order.paid", b"{}"), check_times=1)
        assert checker.request_check(request) is True
        if drain is not None:  # a worker: it takes every task
            for task in drain.iterdir():
                task.unlink()
        time.sleep(0.05)


def test_a_queue_nobody_takes_from_is_a_warning_that_says_where(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "celery"
    checker = CeleryChecker(make_app(OutboxSettings(celery_data_dir=folder)), stall_s=0.3)
    with caplog.at_level(logging.WARNING, logger="outbox.integrations.celery.checker"):
        _send_checks(checker, 1.0)
    [warning] = [r.getMessage() for r in caplog.records if "no Celery worker" in r.getMessage()]
    assert f"filesystem:/// (folder {folder / 'queue'})" in warning
    assert "queue outbox.check.shop" in warning and "-Q outbox.check.shop" in warning


def test_a_queue_a_worker_drains_is_quiet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "celery"
    checker = CeleryChecker(make_app(OutboxSettings(celery_data_dir=folder)), stall_s=0.3)
    with caplog.at_level(logging.WARNING, logger="outbox.integrations.celery.checker"):
        _send_checks(checker, 1.0, drain=folder / "queue")
    assert not [r for r in caplog.records if "no Celery worker" in r.getMessage()]
