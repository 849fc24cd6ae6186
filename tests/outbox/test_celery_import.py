"""Importing the standalone Celery app does no I/O: its ``filesystem://`` folders are made
when the app is first used (``celery -A outbox.integrations.celery.worker``), not at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _python(code: str, data_dir: Path) -> str:
    env = {**os.environ, "OUTBOX_CELERY_DATA_DIR": str(data_dir), "OUTBOX_CELERY_BROKER_URL": "filesystem://"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_importing_the_worker_makes_no_folder_and_using_it_does(tmp_path: Path) -> None:
    data_dir = tmp_path / "celery"
    _python("import outbox.integrations.celery.worker, outbox.integrations.celery.app", data_dir)
    assert not data_dir.exists()
    found = _python("from celery.app.utils import find_app; print(find_app('outbox.integrations.celery.worker')"
                    ".tasks['outbox.check_transaction'].name)", data_dir)
    assert found == "outbox.check_transaction"
    assert sorted(path.name for path in data_dir.iterdir()) == ["control", "processed", "queue"]
