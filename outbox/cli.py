"""The ``outbox`` command (also ``python -m outbox``).

    outbox consume --group G --topic T --handler module:function [--database-url URL] [--broker-url URL]
                   [--batch-size N] [--filter 'TagA || TagB'] [--filter-type TAG|SQL92]
    outbox check TRANSACTION_ID --group G [--database-url URL] [--broker-url URL] [--send]
    outbox migrate [--database-url URL]
    outbox purge [--database-url URL ...] [--broker-url URL] [--table T ...] [--dry-run] ...
    outbox relay [--database-url URL ...] [--broker-url URL] [--batch-size N] [--idle-s S]
    outbox status [--database-url URL ...]
    outbox reconcile ...          (the PySpark reconciliation job; see its --help)

``--handler`` names either a plain ``handler(session, received)``, which ``consume`` makes
idempotent for ``--group`` against ``--database-url``, or a handler already wrapped by
``@idempotent_consumer`` (used as it is); it is imported from the current directory too,
as ``gunicorn`` and ``celery -A`` do. Settings default to the ``OUTBOX_*`` environment
variables (``outbox.settings``); with neither ``--database-url`` nor ``OUTBOX_DATABASE_URL``,
``migrate`` says which default database it creates. ``consume --batch`` is the former
spelling of ``--batch-size``, still accepted. ``consume --filter`` is the group's
subscription, a RocketMQ TAG expression (``*``, the default, takes every message), or with
``--filter-type SQL92`` an SQL92 condition over the message's properties (the subset of
docs/rocketmq.md); the messages it passes over are consumed for the group.

``purge`` deletes what retention allows (docs/retention.md) from every database of the
settings (``OUTBOX_DATABASE_URL`` and ``OUTBOX_GROUP_DATABASES``) unless ``--database-url``
names them; it prints its progress and a report per database.

``relay`` hands the messages store mode kept in the databases (``on_broker_down="store"``)
to the broker (``outbox.relay``) until SIGTERM or SIGINT, then exits 0; ``status`` prints,
per database and producer group, how many stored messages wait for it and the oldest's age.
Both default to every database of the settings, as ``purge`` does.

The exit statuses are in ``EXIT_STATUS``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence

from broker_embedded import BrokerAPI, Resolution, connect
from broker_embedded.cli_tools import (
    CommandParser,
    SpecImportError,
    hidden_alias,
    load_attribute,
    non_negative_float,
    positive_int,
    quiet_on_broken_pipe,
)
from broker_embedded.errors import BrokerError, InvalidMessageError
from broker_embedded.filters import SQL92, TAG, parse_filter

from .check_back import answer_check_back
from .consumer import Handler, run_consumer, stop_on_signals
from .errors import ConfigurationError, OutboxError
from .idempotency import GROUP_ATTRIBUTE
from .purge_command import add_purge_arguments, progress_printer, purge_options
from .settings import DEFAULT_BROKER_URL, OutboxSettings, data_home

#: The exit statuses, as --help shows them.
EXIT_STATUS = """exit status:
  0    done
  1    purge left transaction_log alone: the broker could not say which transactions are open
       (consumed_message was purged)
  2    usage, configuration, database, outbox or broker error, in one line on stderr
       (outbox consume: cannot import handler 'x:y': No module named 'x')
  141  the output pipe closed early (outbox check ... | head)

settings not given as options come from the environment: HALFMOON_BROKER_URL,
OUTBOX_DATABASE_URL, OUTBOX_GROUP_DATABASES, ... (README, Configuration)
"""


def _consumer_handler(args: argparse.Namespace, settings: OutboxSettings) -> Handler:
    function = load_attribute(args.handler, "handler")
    if not callable(function):
        raise ConfigurationError(f"--handler {args.handler} is not callable")
    group = getattr(function, GROUP_ATTRIBUTE, None)
    if group is None:
        from sqlalchemy.orm import sessionmaker

        from .integrations.sqlalchemy.consumer import idempotent_consumer
        from .integrations.sqlalchemy.engine import create_engine

        engine = create_engine(args.database_url or settings.database_url)
        return idempotent_consumer(args.group, sessionmaker(engine))(function)
    if group != args.group:
        raise ConfigurationError(f"--handler {args.handler} records consumer group {group!r}, not {args.group!r}")
    return function  # type: ignore[no-any-return]


def consume(args: argparse.Namespace, settings: OutboxSettings) -> int:
    handler = _consumer_handler(args, settings)
    stop = threading.Event()
    stop_on_signals(stop)
    broker = connect(args.broker_url or settings.broker_url)
    try:
        run_consumer(broker, args.group, args.topic, handler, stop, batch_size=args.batch_size, wait_s=1.0,
                     filter_expression=args.filter, filter_type=args.filter_type)
    finally:
        broker.close()
    return 0


def check(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.sqlalchemy.check_back import engine_answer
    from .integrations.sqlalchemy.engine import checker_engine

    engine = checker_engine(args.database_url or settings.database_for(args.group), settings.check_connect_timeout_s)
    answer = engine_answer(engine, settings.check_lock_timeout_ms, settings.check_statement_timeout_ms)
    resolution = answer_check_back(answer, None, args.group, args.transaction_id)
    print(resolution.name)
    if args.send and resolution is not Resolution.UNKNOWN:
        broker = connect(args.broker_url or settings.broker_url)
        try:
            broker.end_transaction(args.transaction_id, resolution, producer_group=args.group, from_check=True)
        finally:
            broker.close()
    return 0


def migrate(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.alembic import current_revision, upgrade

    url = args.database_url or settings.database_url
    if not args.database_url and not os.environ.get("OUTBOX_DATABASE_URL"):
        print(f"outbox migrate: neither --database-url nor OUTBOX_DATABASE_URL given: migrating the default {url}",
              file=sys.stderr, flush=True)
        data_home().mkdir(parents=True, exist_ok=True)
    before = current_revision(url)
    upgrade(url)
    after = current_revision(url)
    if before == after:
        done = f"already at the newest revision, {after}"
    elif before is None:
        done = f"created, at revision {after}"
    else:
        done = f"upgraded from revision {before} to {after}"
    print(f"outbox migrate: the framework tables of {_shown(url)}: {done}")
    return 0


def _shown(url: str) -> str:
    """``url`` with its password hidden."""
    from sqlalchemy.engine import make_url

    return str(make_url(url).render_as_string(hide_password=True))


def database_url(text: str) -> str:
    """An argparse type: a SQLAlchemy URL whose dialect is known (not checked when
    SQLAlchemy is not installed: the command then says which extra it needs)."""
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    except ModuleNotFoundError:
        return text
    try:
        make_url(text).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a database URL (dialect+driver://...): {exc}") from None
    return text


def check_filter(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error for a ``--filter`` that is not an expression of ``--filter-type`` (the
    broker's own parser: the reason is the one the gRPC port gives)."""
    try:
        parse_filter(args.filter, args.filter_type)
    except InvalidMessageError as exc:
        parser.error(f"--filter: {type(exc).__name__}: {exc}")


def _database_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's errors, when it is installed: a database that cannot be used."""
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ModuleNotFoundError:
        return ()
    return (SQLAlchemyError,)


def purge(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.sqlalchemy.retention import purge_databases

    options = purge_options(vars(args), args.group or None)
    brokers: list[BrokerAPI] = []

    def list_open(producer_group: str | None) -> list[str]:
        if not brokers:
            brokers.append(connect(args.broker_url or settings.broker_url))
        return brokers[0].open_transactions(producer_group)

    try:
        reports = purge_databases(args.database_url or settings.databases, settings.retention, list_open, options,
                                  progress_printer(lambda line: print(line, flush=True)),
                                  on_report=lambda report: print(report, flush=True))
    finally:
        for broker in brokers:
            broker.close()
    return 1 if any(report.skipped for report in reports) else 0


def relay(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.sqlalchemy.relay import relays
    from .relay import run_relays

    stop = threading.Event()
    stop_on_signals(stop)
    urls = args.database_url or settings.databases
    broker_url = args.broker_url or settings.broker_url
    broker = connect(broker_url)
    try:
        relaying = relays(urls, broker, batch_size=args.batch_size, connect_timeout_s=settings.check_connect_timeout_s)
        logging.getLogger(__name__).info("outbox relay: relaying the stored messages of %s to %s until SIGTERM/SIGINT",
                                         ", ".join(_shown(url) for url in urls), broker_url)
        run_relays(relaying, stop, idle_s=args.idle_s)
    finally:
        broker.close()
    return 0


def status(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.sqlalchemy.engine import checker_engine
    from .integrations.sqlalchemy.relay import backlog

    for url in args.database_url or settings.databases:
        engine = checker_engine(url, settings.check_connect_timeout_s)
        try:
            waiting = backlog(engine)
        finally:
            engine.dispose()
        print(f"{_shown(url)}:" if waiting else f"{_shown(url)}: no stored messages wait for the relay")
        for group in waiting:
            print(f"  producer group {group.producer_group}: {group.unrelayed} stored message(s) not relayed, "
                  f"oldest {group.oldest_age_s:.1f}s ago")
    return 0


#: What the commands need beyond the core (the ``sqlalchemy`` extra); imported when they run.
_SQLALCHEMY_MODULES = frozenset({"sqlalchemy", "alembic"})


def build_parser() -> argparse.ArgumentParser:
    """The ``outbox`` command's parser (``reconcile`` has its own, in ``outbox.reconcile.cli``)."""
    parser = CommandParser(prog="outbox", description="halfmoon's transactional outbox", epilog=EXIT_STATUS)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("consume", help="run an idempotent consumer")
    c.add_argument("--group", required=True, help="the consumer group")
    c.add_argument("--topic", required=True, help="the topic to consume")
    c.add_argument("--handler", required=True,
                   help="module:function taking (session, received), or an @idempotent_consumer handler")
    c.add_argument("--database-url", type=database_url, help="where outbox_consumed_message and the handler's "
                   "writes live (default: $OUTBOX_DATABASE_URL)")
    _broker_url_option(c)
    c.add_argument("--batch-size", type=positive_int, default=16, help="messages received per request")
    hidden_alias(c, "--batch", "batch_size", type=positive_int)
    c.add_argument("--filter", default="*", metavar="EXPRESSION",
                   help="the messages of the topic the group takes: a TAG expression, '*' (every message, the "
                        "default), 'TagA' or 'TagA || TagB', or with --filter-type SQL92 a condition over the "
                        "message's properties; the others are consumed for the group unhandled")
    c.add_argument("--filter-type", choices=(TAG, SQL92), default=TAG, help="what --filter is (default: TAG)")
    k = sub.add_parser("check", help="answer one check-back by the fencing rule")
    k.add_argument("transaction_id", help="the transaction to check")
    k.add_argument("--group", required=True, help="its producer group")
    k.add_argument("--database-url", type=database_url, help="the group's database with outbox_transaction_log "
                   "(default: the group's in $OUTBOX_GROUP_DATABASES, else $OUTBOX_DATABASE_URL)")
    _broker_url_option(k)
    k.add_argument("--send", action="store_true", help="also send the answer to the broker")
    m = sub.add_parser("migrate", help="create or upgrade the framework tables (Alembic)")
    m.add_argument("--database-url", type=database_url, help="the database (default: $OUTBOX_DATABASE_URL, "
                   "else SQLite in $XDG_DATA_HOME/halfmoon or ~/.local/share/halfmoon, said on stderr)")
    p = sub.add_parser("purge", help="delete what retention allows from the framework tables (docs/retention.md)")
    p.add_argument("--database-url", action="append", type=database_url,
                   help="a database to purge (repeatable; default: every database of the settings)")
    _broker_url_option(p, "the broker to ask which transactions are open")
    p.add_argument("--group", action="append", help="only this producer group's transaction_log rows "
                   "(repeatable; default: every group)")
    add_purge_arguments(p)
    r = sub.add_parser("relay", help="hand the messages store mode kept in the databases to the broker, until "
                       "SIGTERM/SIGINT")
    r.add_argument("--database-url", action="append", type=database_url,
                   help="a database with outbox_stored_message (repeatable; default: every database of the settings)")
    _broker_url_option(r)
    r.add_argument("--batch-size", type=positive_int, default=100, help="stored messages claimed per transaction")
    r.add_argument("--idle-s", type=non_negative_float, default=1.0,
                   help="seconds to wait after a pass that found nothing to relay")
    st = sub.add_parser("status", help="the stored messages waiting for the relay, per producer group")
    st.add_argument("--database-url", action="append", type=database_url,
                    help="a database to report on (repeatable; default: every database of the settings)")
    sub.add_parser("reconcile", help="the PySpark reconciliation report (outbox reconcile --help)", add_help=False)
    return parser


def _broker_url_option(parser: argparse.ArgumentParser, text: str = "the broker") -> None:
    parser.add_argument("--broker-url", help=f"{text} (default: $HALFMOON_BROKER_URL, else {DEFAULT_BROKER_URL})")


@quiet_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 done, 2 an error said in one line on stderr (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reconcile"]:
        from .reconcile.cli import main as reconcile_main

        return int(reconcile_main(argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "consume":
        check_filter(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # a dozen lines of no news
    handled: tuple[type[Exception], ...] = (OutboxError, BrokerError, SpecImportError, *_database_errors())
    try:
        settings = OutboxSettings.from_env()
        commands = {"consume": consume, "check": check, "migrate": migrate, "purge": purge, "relay": relay,
                    "status": status}
        return commands[args.command](args, settings)
    except handled as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # SQLAlchemy's add SQL, a link
        print(f"outbox {args.command}: {reason}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in _SQLALCHEMY_MODULES:
            raise
        print(f"outbox {args.command}: needs SQLAlchemy and Alembic: pip install 'halfmoon[sqlalchemy]'",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
