"""``outbox``: ``--handler`` imports from the current directory, and every failure is one
line on stderr with exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from sqlalchemy import create_engine, select, text

from broker_embedded import EmbeddedBroker, Message
from outbox.integrations.sqlalchemy.tables import consumed_message, metadata

from .scripts import SCRIPTS, one_line, run

HANDLER = '''
from sqlalchemy import text

def award(session, received):
    session.execute(text("INSERT INTO points (body) VALUES (:b)"), {"b": received.message.body.decode()})
'''


def _env_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_consume_imports_the_handler_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "shop_handlers.py").write_text(HANDLER)
    db_url = f"sqlite:///{tmp_path / 'member.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE points (body VARCHAR(32))"))
    broker = EmbeddedBroker(tmp_path / "broker")
    broker.send(Message("order.paid", b"o1", message_id="m1"))
    broker.close()
    consumer = subprocess.Popen(
        [str(SCRIPTS / "outbox"), "consume", "--group", "points", "--topic", "order.paid",
         "--handler", "shop_handlers:award", "--database-url", db_url,
         "--broker-url", f"embedded://{tmp_path / 'broker'}"],
        cwd=tmp_path, env=_env_without_pythonpath(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        consumed: list[str] = []
        while not consumed and consumer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            with engine.connect() as conn:
                consumed = list(conn.execute(select(consumed_message.c.message_id)).scalars())
        consumer.send_signal(signal.SIGTERM)
        output = consumer.communicate(timeout=30)[0]
        assert consumed == ["m1"], output
        assert consumer.returncode == 0, output
        with engine.connect() as conn:
            assert conn.execute(text("SELECT body FROM points")).scalars().all() == ["o1"]
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        engine.dispose()


def test_a_handler_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "shop_handlers.py").write_text(HANDLER)
    common = ("consume", "--group", "points", "--topic", "t", "--database-url", f"sqlite:///{tmp_path / 'x'}")
    cases = {
        "nosuch_module:award": "outbox consume: cannot import handler 'nosuch_module:award': "
                               "No module named 'nosuch_module'",
        "shop_handlers:nope": "outbox consume: cannot import handler 'shop_handlers:nope': "
                              "module 'shop_handlers' has no attribute 'nope'",
        "shop_handlers": "outbox consume: handler must be module:attribute, got 'shop_handlers'",
    }
    for spec, message in cases.items():
        result = run("outbox", *common, "--handler", spec, cwd=tmp_path, env=_env_without_pythonpath())
        assert result.returncode == 2, result.stderr
        assert one_line(result.stderr) == message


def test_a_broker_error_in_check_send_is_one_line_and_exit_2(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    engine.dispose()
    EmbeddedBroker(tmp_path / "broker").close()  # the broker never saw this transaction
    result = run("outbox", "check", "tx-unknown", "--group", "shop", "--database-url", db_url, "--send",
                 "--broker-url", f"embedded://{tmp_path / 'broker'}")
    assert result.returncode == 2
    assert result.stdout.strip() == "ROLLBACK"
    # Above it, the INFO log lines of the check; the error itself is one line, no traceback.
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == "outbox check: no transaction 'tx-unknown' for producer group 'shop'"
