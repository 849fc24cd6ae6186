"""``halfmoon-broker``: every lookup that finds nothing says so in one line on stderr and
exits 1; errors exit 2; empty lists are not errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Message

from .scripts import one_line, run

LOOKUPS = [
    (("query", "--id", "nope"), "no message with id 'nope'"),
    (("query", "--topic", "orders", "--key", "nope"), "no message with key 'nope' in topic 'orders'"),
    (("tx", "state", "nope"), "no transaction 'nope'"),
    (("parked", "resolve", "nope"), "no parked transaction 'nope'"),
    (("parked", "recheck", "nope"), "no parked transaction 'nope'"),
    (("dlq", "resend", "points", "nope"), "'nope'"),
    (("groups", "delete", "nope"), "consumer group 'nope'"),
]


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    broker = EmbeddedBroker(tmp_path / "broker")
    broker.send(Message("orders", b"hi", keys=("k1",), message_id="m1"))
    broker.close()
    return str(tmp_path / "broker")


@pytest.mark.parametrize(("command", "reason"), LOOKUPS, ids=[" ".join(c) for c, _ in LOOKUPS])
def test_a_lookup_that_finds_nothing_exits_1_with_one_line(data_dir: str, command: tuple[str, ...],
                                                            reason: str) -> None:
    result = run("halfmoon-broker", *command, "--data-dir", data_dir)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith("not found: ") and reason in line


def test_lookups_that_find_something_and_empty_lists_exit_0(data_dir: str) -> None:
    found = run("halfmoon-broker", "query", "--id", "m1", "--json", "--data-dir", data_dir)
    assert found.returncode == 0 and json.loads(found.stdout)["message"]["body"] == "hi"
    by_key = run("halfmoon-broker", "query", "--topic", "orders", "--key", "k1", "--json", "--data-dir", data_dir)
    assert by_key.returncode == 0 and len(json.loads(by_key.stdout)) == 1
    for listing in (("parked", "list"), ("dlq", "list", "points")):
        empty = run("halfmoon-broker", *listing, "--data-dir", data_dir)
        assert empty.returncode == 0 and json.loads(empty.stdout) == [], listing


def test_usage_and_broker_errors_exit_2_and_help_documents_the_statuses(tmp_path: Path, data_dir: str) -> None:
    usage = run("halfmoon-broker", "query", "--data-dir", data_dir)
    assert usage.returncode == 2 and "query needs --id ID" in usage.stderr
    conflict = run("halfmoon-broker", "send", "%DLQ%points", "x", "--data-dir", data_dir)
    assert conflict.returncode == 2
    assert one_line(conflict.stderr).startswith("error: ReservedTopicError: ")
    checker = run("halfmoon-broker", "serve", "--data-dir", str(tmp_path / "other"), "--port", "0",
                  "--checker", "no_such_module:factory")
    assert checker.returncode == 2
    assert "cannot import --checker 'no_such_module:factory': No module named 'no_such_module'" in one_line(
        checker.stderr)
    help_text = run("halfmoon-broker", "--help").stdout
    assert "exit status:" in help_text and "not found" in help_text and "141" in help_text


def test_groups_delete_forgets_a_group_and_refuses_one_with_messages_in_flight(data_dir: str) -> None:
    broker = EmbeddedBroker(data_dir)
    broker.send(Message("orders", b"more"))
    received = broker.receive("retired", "orders", max_messages=1, wait_s=1)
    broker.ack("retired", received[0].receipt_handle)
    broker.receive("busy", "orders", max_messages=1, invisible_duration_s=3600, wait_s=1)
    broker.close()
    refused = run("halfmoon-broker", "groups", "delete", "busy", "--data-dir", data_dir)
    assert refused.returncode == 2 and one_line(refused.stderr).startswith("error: GroupInUseError: ")
    deleted = run("halfmoon-broker", "groups", "delete", "retired", "--data-dir", data_dir)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith("consumer group retired deleted: ")
    stats = run("halfmoon-broker", "stats", "--json", "--data-dir", data_dir)
    assert set(json.loads(stats.stdout)["consumer_lag"]) == {"busy"}


def test_groups_reset_moves_a_group_to_the_end_or_the_start(data_dir: str) -> None:
    to_end = run("halfmoon-broker", "groups", "reset", "late", "orders", "--to", "end", "--data-dir", data_dir)
    assert to_end.returncode == 0, to_end.stderr
    assert to_end.stdout.startswith("consumer group late reset on topic orders: 0 message(s) to receive")
    to_start = run("halfmoon-broker", "groups", "reset", "late", "orders", "--to", "2000-01-01T00:00:00Z",
                   "--data-dir", data_dir)
    assert to_start.returncode == 0 and "reset on topic orders: 1 message(s) to receive" in to_start.stdout
    missing = run("halfmoon-broker", "groups", "reset", "late", "nope", "--to", "end", "--data-dir", data_dir)
    assert missing.returncode == 1 and one_line(missing.stderr).startswith("not found: ")
    for usage in (("late", "orders"), ("late", "orders", "--to", "yesterday"), ("late", "--to", "end")):
        refused = run("halfmoon-broker", "groups", "reset", *usage, "--data-dir", data_dir)
        assert refused.returncode == 2 and refused.stdout == "", usage
