"""The purge task on Celery beat, as the docs schedule it: in the user's own app
(``register_purge(app)``) and in a Django project's app (autodiscovery), each run by a real
``celery worker -B`` on Redis against a real broker server: resolved old rows go, a pending
transaction's row stays."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select

from broker_embedded import BrokerClient, Message
from outbox.integrations.sqlalchemy.tables import consumed_message, metadata, transaction_log
from outbox.schema import COMMITTED

from ..server.conftest import ServerProcess
from .celery_workers import CeleryWorker, wait_until

#: The user's Celery app with the purge task and the beat entry of docs/retention.md (every second here).
USER_APP = '''
import os
from celery import Celery
from outbox.integrations.celery import PURGE_TASK, register_purge

app = Celery("shop", broker=os.environ["SHOP_CELERY_URL"])
app.conf.broker_connection_retry_on_startup = True
register_purge(app)
app.conf.beat_schedule = {"outbox-purge": {"task": PURGE_TASK, "schedule": 1.0, "kwargs": {"pause_s": 0}}}
'''

DJANGO_SETTINGS = '''
import os

SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "outbox.integrations.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SHOP_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
OUTBOX = {"BROKER_URL": os.environ["OUTBOX_BROKER_URL"], "PRODUCER_GROUP": "shop"}
CELERY_BROKER_URL = os.environ["SHOP_CELERY_URL"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {"outbox-purge": {"task": "outbox.purge", "schedule": 1.0, "kwargs": {"pause_s": 0}}}
'''

DJANGO_CELERY = '''
import os
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
'''

OLD = datetime.now(UTC) - timedelta(days=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "broker").start()
    with BrokerClient(server.url) as client:
        client.send_half(Message("orders", b"q", transaction_timeout_s=3600), producer_group="shop",
                         transaction_id="pending")
    yield server
    server.kill()


def _old_rows(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(transaction_log), [
            {"transaction_id": tx, "producer_group": "shop", "state": COMMITTED, "created_at": OLD}
            for tx in ("pending", "done-1", "done-2")])
        conn.execute(insert(consumed_message), [
            {"consumer_group": "points", "message_id": f"m{n}", "topic": "order.paid", "consumed_at": OLD}
            for n in range(3)])


def _purged(engine: Engine) -> bool:
    with engine.connect() as conn:
        left = set(conn.execute(select(transaction_log.c.transaction_id)).scalars())
        consumed = conn.execute(select(func.count()).select_from(consumed_message)).scalar_one()
    assert "pending" in left
    return left == {"pending"} and consumed == 0


def _beat_purges(worker: CeleryWorker, engine: Engine) -> None:
    try:
        wait_until(lambda: _purged(engine), 60, f"the beat's purge (see {worker.log})")
        wait_until(lambda: worker.count(r"outbox\.purge\[[^\]]+\] succeeded") >= 1, 30, "the task's log line")
    finally:
        worker.kill()
        engine.dispose()


@pytest.mark.slow
@pytest.mark.redis
def test_beat_runs_the_purge_registered_in_the_users_app(tmp_path: Path, celery_url: str,
                                                          server: ServerProcess) -> None:
    database = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(database)
    metadata.create_all(engine)
    _old_rows(engine)
    (tmp_path / "userapp.py").write_text(USER_APP)
    worker = CeleryWorker(tmp_path / "worker.log", "userapp", ["celery"], {
        "SHOP_CELERY_URL": celery_url, "OUTBOX_BROKER_URL": server.url, "OUTBOX_DATABASE_URL": database,
    }, cwd=tmp_path, beat=True)
    _beat_purges(worker, engine)


@pytest.mark.slow
@pytest.mark.redis
def test_beat_runs_the_django_projects_autodiscovered_purge(tmp_path: Path, celery_url: str,
                                                            server: ServerProcess) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "settings.py").write_text(DJANGO_SETTINGS)
    (tmp_path / "proj" / "celery.py").write_text(DJANGO_CELERY)
    env = {"SHOP_DATABASE": str(tmp_path / "shop.sqlite3"), "SHOP_CELERY_URL": celery_url,
           "OUTBOX_BROKER_URL": server.url}
    subprocess.run([sys.executable, "-m", "django", "migrate", "--verbosity", "0"], cwd=tmp_path, check=True,
                   env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "proj.settings", "PYTHONPATH": str(tmp_path)},
                   timeout=120)
    engine = create_engine(f"sqlite:///{env['SHOP_DATABASE']}")
    _old_rows(engine)
    worker = CeleryWorker(tmp_path / "worker.log", "proj", ["celery"], env, cwd=tmp_path, beat=True)
    _beat_purges(worker, engine)
