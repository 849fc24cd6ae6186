"""State files of a data directory that cannot be read.

A loss ledger (``losses.json``) that cannot be read keeps no store from opening. It is
written when the disk is known to be failing (it has lost records), so it is the state file
most likely to be damaged itself. Before, a damaged one made every open fail with a bare
``JSONDecodeError`` (or ``KeyError``, ``TypeError``): the broker could not restart.

``store.json`` pins the directory's layout: guessing it could misread every segment, so an
unreadable one refuses the open, but with a typed error that says what to write back.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from broker_embedded.cli.main import main
from broker_embedded.errors import CorruptStateError
from broker_embedded.store import verify
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.losses import LEDGER_FILE, LossLedger
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
from broker_embedded.store.scrub import damage_reasons

STORE = StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600, index_slots=1024, index_entries=4096,
                    scrub_bytes_per_s=0)

GARBAGE = [b"{", b"", b"\xff\xfe", b"[]", b'{"losses": 5}', b'{"losses": [{"loss_id": 1}]}',
           b'{"losses": [], "unreadable": 3}', b'{"loss": []}']


def _put(store: MessageStore, n: int) -> None:
    store.put(StoredRecord("orders", 0, b"body", {"UNIQ_KEY": f"id{n}"}))


@pytest.mark.parametrize("garbage", GARBAGE)
def test_an_unreadable_ledger_is_set_aside_and_the_store_opens_degraded_until_acknowledged(
        tmp_path: Path, garbage: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with MessageStore(tmp_path, STORE) as store:
        _put(store, 0)
    LossLedger(tmp_path).record("scrub", 0, 10, ["id0"], 0, "a loss the damage takes with it")
    (tmp_path / LEDGER_FILE).write_bytes(garbage)

    problems = verify.check(tmp_path).problems  # fsck says so and changes nothing
    assert any("cannot be read" in problem for problem in problems), problems
    assert (tmp_path / LEDGER_FILE).read_bytes() == garbage
    with pytest.raises(CorruptStateError, match="cannot be read"):
        verify.list_losses(tmp_path)
    assert main(["losses", "--data-dir", str(tmp_path)]) == 2

    with caplog.at_level(logging.ERROR, logger="broker_embedded.store.losses"), \
            MessageStore(tmp_path, STORE) as store:
        [reason] = damage_reasons(store)
        assert "cannot be read" in reason and "losses.json.unreadable" in reason
        _put(store, 1)  # it serves
    assert "cannot be read" in caplog.text
    assert (tmp_path / "losses.json.unreadable").read_bytes() == garbage  # kept for whoever looks at it

    with MessageStore(tmp_path, STORE) as store:  # still degraded after a restart
        assert damage_reasons(store) == [reason]
    assert reason in "\n".join(verify.list_losses(tmp_path).lines())
    assert main(["losses", "--data-dir", str(tmp_path)]) == 1
    assert any(reason in problem for problem in verify.check(tmp_path).problems)
    assert main(["losses", "--data-dir", str(tmp_path), "--acknowledge"]) == 0
    with MessageStore(tmp_path, STORE) as store:
        assert damage_reasons(store) == []
        assert store.losses.all() == []
    assert verify.check(tmp_path).ok


def test_a_second_unreadable_ledger_keeps_the_first_one_set_aside(tmp_path: Path) -> None:
    with MessageStore(tmp_path, STORE) as store:
        _put(store, 0)
    for garbage in (b"first", b"second"):
        (tmp_path / LEDGER_FILE).write_bytes(garbage)
        with MessageStore(tmp_path, STORE):
            pass
    assert (tmp_path / "losses.json.unreadable").read_bytes() == b"first"
    assert (tmp_path / "losses.json.unreadable.1").read_bytes() == b"second"


def test_acknowledging_some_losses_by_id_leaves_an_unreadable_ledger_open(tmp_path: Path) -> None:
    with MessageStore(tmp_path, STORE) as store:
        _put(store, 0)
    (tmp_path / LEDGER_FILE).write_bytes(b"{")
    with MessageStore(tmp_path, STORE) as store:
        loss = store.losses.record("scrub", 0, 10, ["id0"], 0, "found after the ledger was set aside")
        store.losses.acknowledge([loss.loss_id])
        [reason] = damage_reasons(store)
        assert "cannot be read" in reason


@pytest.mark.parametrize("garbage", [b"{", b"", b"\xff", b"[]", b'{"segment_size": "65536"}', b'{"segment_size": 0}',
                                     b'{"segment_size": 65536, "consume_queue_file_entries": null}'])
def test_an_unreadable_store_json_refuses_the_open_with_a_typed_error_saying_what_to_write(
        tmp_path: Path, garbage: bytes) -> None:
    with MessageStore(tmp_path, STORE) as store:
        stored = store.put_batch([StoredRecord("orders", n % 4, b"body" * 40, {"UNIQ_KEY": f"id{n}"})
                                  for n in range(1000)])
    assert len({r.commit_log_offset // STORE.segment_size for r in stored}) > 1
    (tmp_path / "store.json").write_bytes(garbage)
    with pytest.raises(CorruptStateError, match=f"segments lie {STORE.segment_size} bytes apart"):
        MessageStore(tmp_path, STORE)
    assert main(["fsck", "--data-dir", str(tmp_path)]) == 2
    layout = {"segment_size": STORE.segment_size, "consume_queue_file_entries": STORE.consume_queue_file_entries}
    (tmp_path / "store.json").write_text(json.dumps(layout))  # as the error says
    with MessageStore(tmp_path, STORE) as store:  # the refused open left the directory free
        assert sum(len(store.read_queue("orders", q, 0, 1000)) for q in range(4)) == 1000
