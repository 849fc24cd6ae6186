"""Output into a pipe whose reader went away (``halfmoon-broker stats | head``): the
commands stop quietly with 141, like ``yes | head``, and print no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sqlalchemy import create_engine

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.cli_tools import BROKEN_PIPE_EXIT
from outbox.integrations.sqlalchemy.tables import metadata

from .scripts import SCRIPTS


def test_broker_output_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    # 2 MB of JSON: far more than the pipe buffer, so the writer meets the closed pipe.
    broker.send(Message("orders", b"x" * (2 << 20), message_id="big"))
    broker.close()
    command = [str(SCRIPTS / "halfmoon-broker"), "query", "--id", "big", "--json", "--data-dir", str(tmp_path / "broker")]
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-n1"], stdin=writer.stdout, stdout=subprocess.PIPE)
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()  # only head reads it now
    first_line = head.communicate(timeout=60)[0]
    stderr = writer.stderr.read().decode()
    writer.stderr.close()
    assert writer.wait(60) == BROKEN_PIPE_EXIT, stderr
    assert first_line == b"{\n"
    assert stderr == ""


def test_outbox_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    engine = create_engine(db_url)
    metadata.create_all(engine)
    engine.dispose()
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        result = subprocess.run(
            [str(SCRIPTS / "outbox"), "check", "tx-1", "--group", "shop", "--database-url", db_url],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.returncode == BROKEN_PIPE_EXIT, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
