"""The ``filesystem://`` transport the Celery checker uses: a worker polling the folder
never takes a message before it is whole (kombu's own channel writes the file under its
final name, and a reader racing it failed with ``JSONDecodeError`` and stopped the worker)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from queue import Empty

from kombu import Connection

from outbox.integrations.celery.app import make_app
from outbox.integrations.celery.transport import TRANSPORT, Channel
from outbox.settings import OutboxSettings

BODY = {"padding": "x" * 200_000}  # big enough that a write takes a while


def _connection(folder: Path) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    return Connection("filesystem://", transport=TRANSPORT, transport_options=options)


def _put(folder: Path, count: int) -> None:
    with _connection(folder) as connection:
        channel = connection.default_channel
        for number in range(count):
            channel._put("checks", {**BODY, "number": number})


def test_a_reader_racing_a_writer_gets_every_message_whole_and_once(tmp_path: Path) -> None:
    count = 400
    writer = multiprocessing.get_context("spawn").Process(target=_put, args=(tmp_path, count))
    writer.start()
    numbers: list[int] = []
    try:
        with _connection(tmp_path) as connection:
            channel = connection.default_channel
            deadline = time.monotonic() + 60
            while len(numbers) < count and time.monotonic() < deadline:
                try:
                    numbers.append(channel._get("checks")["number"])  # raised JSONDecodeError before
                except Empty:
                    time.sleep(0.0005)
    finally:
        writer.join(30)
        if writer.is_alive():
            writer.kill()
    assert sorted(numbers) == list(range(count))
    assert not list(tmp_path.iterdir()), "a partial or unread file was left behind"


def test_the_checkers_app_uses_it_for_a_folder_queue(tmp_path: Path) -> None:
    settings = OutboxSettings(celery_broker_url="filesystem://", celery_data_dir=tmp_path)
    with make_app(settings).connection_for_write() as connection:
        assert isinstance(connection.default_channel, Channel)


def test_a_filesystem_url_needs_no_host_and_logs_no_warning(tmp_path: Path, caplog) -> None:
    """kombu's default host for a transport is ``localhost``; a folder needs none, and every
    connection to ``filesystem://`` logged "No hostname was supplied" (the broker's checker
    and each worker, at start)."""
    with caplog.at_level("WARNING"), _connection(tmp_path) as connection:
        connection.default_channel._put("checks", {"number": 1})
        assert connection.as_uri().startswith(TRANSPORT)  # what Celery logs as it connects
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
