"""A Django project's own Celery app finds the check task by autodiscovery
(``outbox.integrations.django.tasks``) and answers real check-backs with the fence on the
project's ``DATABASES``: a real ``celery -A proj worker`` on Redis, a real broker server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from broker_embedded import BrokerClient, Message, TransactionState
from outbox.integrations.celery import check_queue
from outbox.integrations.sqlalchemy.engine import create_engine
from outbox.integrations.sqlalchemy.recorder import record_committed
from outbox.integrations.sqlalchemy.tables import transaction_log

from ..server.conftest import ServerProcess
from .celery_workers import CeleryWorker, wait_until

pytest.importorskip("django")

SETTINGS = '''
import os

SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "outbox.integrations.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SHOP_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The worker's own producer would answer first (the default); this test is about the task.
OUTBOX = {"BROKER_URL": os.environ["SHOP_BROKER_URL"], "PRODUCER_GROUP": os.environ["SHOP_GROUP"],
          "ANSWER_CHECK_BACKS": False}
CELERY_BROKER_URL = os.environ["SHOP_CELERY_URL"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
'''

#: The usual ``proj/celery.py`` of Celery's Django guide, nothing outbox-specific in it.
CELERY = '''
import os
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
'''

FINAL = (TransactionState.COMMITTED, TransactionState.ROLLED_BACK)


def _project(tmp_path: Path, env: dict[str, str]) -> Engine:
    """The Django project ``proj`` in ``tmp_path``, migrated; an engine on its database."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "settings.py").write_text(SETTINGS)
    (tmp_path / "proj" / "celery.py").write_text(CELERY)
    subprocess.run([sys.executable, "-m", "django", "migrate", "--verbosity", "0"], cwd=tmp_path, check=True,
                   env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "proj.settings",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))},
                   timeout=120)
    return create_engine(f"sqlite:///{env['SHOP_DATABASE']}")


@pytest.mark.slow
@pytest.mark.redis
def test_the_django_projects_worker_answers_check_backs_by_autodiscovery(tmp_path: Path, celery_url: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    group = f"django-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OUTBOX_CELERY_BROKER_URL", celery_url)  # the broker server inherits it
    server = ServerProcess(tmp_path / "broker", "--transaction-timeout", "1", "--check-interval", "1",
                           "--checker", "outbox.integrations.celery.checker:make_checker").start()
    env = {"SHOP_DATABASE": str(tmp_path / "shop.sqlite3"), "SHOP_BROKER_URL": server.url, "SHOP_GROUP": group,
           "SHOP_CELERY_URL": celery_url}
    engine = _project(tmp_path, env)
    worker = CeleryWorker(tmp_path / "worker.log", "proj", ["celery", check_queue(group)], env, cwd=tmp_path)
    try:
        with BrokerClient(server.url) as client:
            for transaction_id in ("tx-committed", "tx-lost"):  # producers that crashed
                client.send_half(Message("order.paid", transaction_id.encode()), producer_group=group,
                                 transaction_id=transaction_id)
            with engine.begin() as conn:
                record_committed(conn, "tx-committed", group)
            wait_until(lambda: all(client.transaction_state(t) in FINAL for t in ("tx-committed", "tx-lost")),
                       90, f"the check-backs (see {worker.log})")
            assert client.transaction_state("tx-committed") is TransactionState.COMMITTED
            assert client.transaction_state("tx-lost") is TransactionState.ROLLED_BACK
        with engine.connect() as conn:
            logged = dict(conn.execute(select(transaction_log.c.transaction_id, transaction_log.c.state)).all())
        assert logged == {"tx-committed": "COMMITTED", "tx-lost": "ROLLED_BACK"}  # the fence, in Django's DB
        # the worker logs a task's success after the task ended the transaction: wait for the line
        wait_until(lambda: worker.count(r"outbox\.check_transaction\[[^\]]+\] succeeded") >= 2, 30,
                   f"two check tasks logged as succeeded (see {worker.log})")
    finally:
        worker.kill()
        server.kill()
        engine.dispose()
