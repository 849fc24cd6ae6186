"""The Django integration in an environment without SQLAlchemy (issue 11 item 5).

A fresh venv (no system site-packages) gets the project with its ``django`` extra only;
a minimal Django project there migrates, commits a ``@transactional_message`` call, reads
the message from the embedded broker, has the fenced check answer COMMIT and the
idempotent consumer skip a redelivery, while ``import sqlalchemy`` fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.wheelhouse import built_wheel

SETTINGS = """
import os
BASE = os.environ["PROJECT_DIR"]
SECRET_KEY = "no-sqlalchemy"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "outbox.integrations.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(BASE, "db.sqlite3")}}
OUTBOX = {"BROKER_URL": "embedded://" + os.path.join(BASE, "broker"), "PRODUCER_GROUP": "shop"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""

SCENARIO = """
import importlib.util, json, os, sys
from decimal import Decimal

import django
from django.core.management import call_command

django.setup()
call_command("migrate", verbosity=0)

import outbox
from outbox.integrations.django import models  # noqa: F401  (the point of item 5)
from outbox.integrations.django.conf import producer
from outbox.integrations.django.consumer import idempotent_consumer
from outbox.integrations.django.recorder import fenced_answer
from outbox.integrations.django.transactional import transactional_message

@transactional_message(topic="order.paid", keys=lambda order_id, amount: [order_id])
def pay(order_id, amount):
    return outbox.current_transaction_id()

tx = pay("o-1", Decimal("9.90"))
received = producer().broker.receive("points", "order.paid", wait_s=5)
award = idempotent_consumer("points")(lambda message: None)
try:
    from outbox import install  # noqa: F401
    lazy_error = ""
except ImportError as exc:
    lazy_error = str(exc)
print(json.dumps({
    "sqlalchemy_importable": importlib.util.find_spec("sqlalchemy") is not None,
    "sqlalchemy_loaded": "sqlalchemy" in sys.modules,
    "bodies": [outbox.message_json(r.message) for r in received],
    "keys": [list(r.message.keys) for r in received],
    "same_transaction": [r.transaction_id == tx for r in received],
    "check": fenced_answer(tx).name,
    "consumed": [award(r) for r in received + received],
    "lazy_error": lazy_error,
}))
producer().close()
"""


@pytest.mark.slow
def test_django_integration_works_without_sqlalchemy(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"halfmoon[django] @ {built_wheel().as_uri()}"], check=True)

    project = tmp_path / "project"
    project.mkdir()
    (project / "project_settings.py").write_text(textwrap.dedent(SETTINGS))
    (project / "scenario.py").write_text(textwrap.dedent(SCENARIO))
    env = {"PATH": "/usr/bin:/bin", "PROJECT_DIR": str(project), "PYTHONPATH": str(project),
           "DJANGO_SETTINGS_MODULE": "project_settings"}
    done = subprocess.run([str(python), str(project / "scenario.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "sqlalchemy_importable": False,
        "sqlalchemy_loaded": False,
        "bodies": [{"order_id": "o-1", "amount": "9.90"}],
        "keys": [["o-1"]],
        "same_transaction": [True],
        "check": "COMMIT",
        "consumed": [True, False],  # the redelivery is skipped
        "lazy_error": result["lazy_error"],
    }
    assert "pip install 'halfmoon[sqlalchemy]'" in result["lazy_error"]
