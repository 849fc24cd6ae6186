"""Every command and subcommand: help for every option with its default, ``--version``, no
reST markup in help, a one-line error (exit 2) for bad input, and the first-hour details
(python -m outbox, migrate's default database, tables for stats and query, the old option
spellings, the console's address said once, ``./dev bench`` listing the benchmarks)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.cli.main import build_parser as broker_parser
from broker_embedded.cli_tools import HelpFormatter, version
from outbox.cli import build_parser as outbox_parser

from ..server.conftest import ServerProcess
from .scripts import SCRIPTS, one_line, run

ROOT = Path(__file__).resolve().parents[2]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {"halfmoon-broker": broker_parser(), "outbox": outbox_parser()}
    pytest.importorskip("pyspark")
    from outbox.reconcile.cli import build_parser as reconcile_parser

    parsers["outbox reconcile"] = reconcile_parser()
    return parsers


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it, from the parser objects."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _walk(sub)


def test_every_option_of_every_subcommand_has_help_with_its_default_and_no_rest_markup() -> None:
    parsers = [parser for root in _parsers().values() for parser in _walk(root)]
    assert len(parsers) >= 20, [p.prog for p in parsers]
    for parser in parsers:
        assert "--version" in parser._option_string_actions, parser.prog
        text = parser.format_help()
        assert "``" not in text, parser.prog
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue  # a hidden former spelling, or the subcommands themselves
            name = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{name} has no help text"
            shown = HelpFormatter(parser.prog)._get_help_string(action)
            if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in shown, f"{name} does not show its default {action.default!r}"


@pytest.mark.parametrize("command", [["halfmoon-broker"], ["outbox"], [sys.executable, "-m", "outbox"],
                                     [sys.executable, "-m", "broker_embedded"]], ids=lambda c: " ".join(c[-2:]))
def test_each_entry_point_has_help_and_version(command: list[str]) -> None:
    executable = [str(SCRIPTS / command[0])] if len(command) == 1 else command
    shown = subprocess.run([*executable, "--version"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == f"halfmoon {version()}", shown.stderr
    helped = subprocess.run([*executable, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "exit status:" in helped.stdout and "``" not in helped.stdout


BAD_INPUT = [
    (("halfmoon-broker", "serve", "--data-dir", "d", "--port", "99999"), "'99999' is not a port number"),
    (("halfmoon-broker", "serve", "--data-dir", "d", "--http-port", "-1"), "'-1' is not a port number"),
    (("halfmoon-broker", "receive", "g", "t", "--batch-size", "0", "--data-dir", "d"), "'0' is not a whole number"),
    (("halfmoon-broker", "serve", "--data-dir", "d", "--check-interval", "soon"), "'soon' is not a number"),
    (("outbox", "migrate", "--database-url", "nope"), "'nope' is not a database URL"),
    (("outbox", "check", "tx", "--group", "g", "--database-url", "nosuchdialect://x"), "is not a database URL"),
    (("outbox", "consume", "--group", "g", "--topic", "t", "--handler", "m:f", "--batch", "x"),
     "'x' is not a whole number"),
]


@pytest.mark.parametrize(("command", "reason"), BAD_INPUT, ids=[" ".join(c[:2] + c[-2:]) for c, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, command: tuple[str, ...], reason: str) -> None:
    result = run(*command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert reason in one_line(result.stderr)
    assert not (tmp_path / "d").exists()


def test_a_database_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    result = run("outbox", "migrate", "--database-url", f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}")
    assert result.returncode == 2
    assert one_line(result.stderr) == "outbox migrate: (sqlite3.OperationalError) unable to open database file"


def _newest_revision() -> str:
    """The number of our newest Alembic revision (its file name's first four characters)."""
    return sorted(path.name[:4] for path in (ROOT / "migrations" / "alembic" / "versions").glob("0*.py"))[-1]


def test_migrate_without_a_url_says_which_database_and_never_uses_the_working_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    (tmp_path / "work").mkdir()
    result = subprocess.run([sys.executable, "-m", "outbox", "migrate"], cwd=tmp_path / "work", env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    database = tmp_path / "data" / "halfmoon" / "outbox.sqlite3"
    assert database.is_file() and list((tmp_path / "work").iterdir()) == []
    assert f"migrating the default sqlite:///{database}" in result.stderr
    newest = _newest_revision()
    assert result.stdout.strip() == f"outbox migrate: the framework tables of sqlite:///{database}: created, at " \
                                    f"revision {newest}"
    again = subprocess.run([sys.executable, "-m", "outbox", "migrate"], cwd=tmp_path / "work", env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.stdout.strip().endswith(f": already at the newest revision, {newest}"), again.stdout


def test_stats_and_query_print_tables_or_json_and_the_old_spellings_still_work(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    broker.send(Message("orders", b'{"order": 1}', keys=("k1",), message_id="m1"))
    broker.close()
    data_dir = ("--data-dir", str(tmp_path / "broker"))
    stats = run("halfmoon-broker", "stats", *data_dir)
    assert stats.returncode == 0, stats.stderr
    lines = stats.stdout.splitlines()
    assert lines[0].split() == ["topic", "queues", "messages", "per", "queue"]
    assert lines[1].split()[:3] == ["orders", "4", "1"]
    assert "pending half messages  0" in stats.stdout
    assert json.loads(run("halfmoon-broker", "stats", "--json", *data_dir).stdout)["topics"][0]["name"] == "orders"
    found = run("halfmoon-broker", "query", "--topic", "orders", "--key", "k1", *data_dir).stdout.splitlines()
    assert found[0].split()[:3] == ["message", "id", "topic"]
    assert found[1].split()[:3] == ["m1", "orders", "0:0"] and found[1].endswith('{"order": 1}')
    old = run("halfmoon-broker", "receive", "g", "orders", "--max", "1", "--no-ack", *data_dir)
    assert old.returncode == 0 and json.loads(old.stdout)[0]["message"]["message_id"] == "m1"
    assert json.loads(run("halfmoon-broker", "receive", "other", "orders", "--filter", "paid || shipped",
                          *data_dir).stdout) == []  # the message has no tag: the group skips it
    malformed = run("halfmoon-broker", "receive", "g", "orders", "--filter", "a ||", *data_dir)
    assert malformed.returncode == 2 and "InvalidMessageError" in malformed.stderr
    unreachable = run("halfmoon-broker", "stats", "--url", "tcp://127.0.0.1:1")
    assert unreachable.returncode == 2 and "127.0.0.1:1" in one_line(unreachable.stderr)


def test_receive_takes_an_sql92_filter_with_the_grpc_ports_subset_and_errors(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    for n, amount in enumerate((3, 8)):
        broker.send(Message("orders", b"order", properties={"amount": str(amount)}, message_id=f"m{n}"))
    broker.close()
    data_dir = ("--data-dir", str(tmp_path / "broker"))
    taken = run("halfmoon-broker", "receive", "g", "orders", "--filter", "amount > 5", "--filter-type", "SQL92",
                *data_dir)
    assert [item["message"]["message_id"] for item in json.loads(taken.stdout)] == ["m1"]
    malformed = run("halfmoon-broker", "receive", "g", "orders", "--filter", "amount >", "--filter-type", "SQL92",
                    *data_dir)
    assert malformed.returncode == 2 and "InvalidMessageError" in malformed.stderr
    assert "Traceback" not in malformed.stderr


def test_serve_says_once_where_the_console_is(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "broker", "--http-port", "0").start()
    try:
        deadline = time.monotonic() + 30
        while "HTTP port on" not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
    output = server.log.read_text()
    [line] = [line for line in output.splitlines() if "http://127.0.0.1:" in line]
    url = line.split("HTTP port on ")[1].split()[0]
    assert f"the console at {url}/" in line


def test_dev_bench_lists_the_benchmarks() -> None:
    listed = subprocess.run(["bash", str(ROOT / "dev"), "bench"], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert names == {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    unknown = subprocess.run(["bash", str(ROOT / "dev"), "bench", "nope"], capture_output=True, text=True,
                             timeout=30)
    assert unknown.returncode == 2 and "no benchmark 'nope'" in unknown.stderr


def test_migrate_says_from_which_revision_it_upgraded(tmp_path: Path) -> None:
    from outbox.integrations.alembic import upgrade

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    upgrade(url, "0002")
    result = subprocess.run([sys.executable, "-m", "outbox", "migrate", "--database-url", url],
                            capture_output=True, text=True, timeout=120)
    newest = _newest_revision()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f": upgraded from revision 0002 to {newest}"), result.stdout
