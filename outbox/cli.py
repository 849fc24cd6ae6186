"""The ``outbox`` command.

    outbox consume --group G --topic T --handler module:function [--database-url URL] [--broker-url URL]
    outbox check TRANSACTION_ID --group G [--database-url URL] [--broker-url URL] [--send]
    outbox migrate [--database-url URL]
    outbox purge [--database-url URL ...] [--broker-url URL] [--table T ...] [--dry-run] ...
    outbox reconcile ...          (the PySpark reconciliation job; see its --help)

``--handler`` names either a plain ``handler(session, received)``, which ``consume`` makes
idempotent for ``--group`` against ``--database-url``, or a handler already wrapped by
``@idempotent_consumer`` (used as it is); it is imported from the current directory too,
as ``gunicorn`` and ``celery -A`` do. Settings default to the ``OUTBOX_*`` environment
variables.

``purge`` deletes what retention allows (docs/retention.md) from every database of the
settings (``OUTBOX_DATABASE_URL`` and ``OUTBOX_GROUP_DATABASES``) unless ``--database-url``
names them; it prints its progress and a report per database.

Exit status: 0 done; 1 ``purge`` left transaction_log alone because the broker could not
say which transactions are open (consumed_message was purged); 2 a usage, configuration,
outbox or broker error, said in one line on stderr (``outbox consume: cannot import
handler 'x:y': No module named 'x'``); 141 the output pipe closed early (``outbox check
... | head``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence

from broker_embedded import BrokerAPI, Resolution, connect
from broker_embedded.cli_tools import SpecImportError, load_attribute, quiet_on_broken_pipe
from broker_embedded.errors import BrokerError

from .consumer import Handler, run_consumer, stop_on_signals
from .errors import ConfigurationError, OutboxError
from .idempotency import GROUP_ATTRIBUTE
from .purge_command import add_purge_arguments, progress_printer, purge_options
from .settings import OutboxSettings


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
        run_consumer(broker, args.group, args.topic, handler, stop, batch_size=args.batch, wait_s=1.0)
    finally:
        broker.close()
    return 0


def check(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.sqlalchemy.engine import checker_engine
    from .integrations.sqlalchemy.fence import check_transaction

    engine = checker_engine(args.database_url or settings.database_for(args.group), settings.check_connect_timeout_s)
    resolution = check_transaction(engine, args.transaction_id, args.group, settings.check_lock_timeout_ms,
                                   settings.check_statement_timeout_ms)
    print(resolution.name)
    if args.send and resolution is not Resolution.UNKNOWN:
        broker = connect(args.broker_url or settings.broker_url)
        try:
            broker.end_transaction(args.transaction_id, resolution, producer_group=args.group, from_check=True)
        finally:
            broker.close()
    return 0


def migrate(args: argparse.Namespace, settings: OutboxSettings) -> int:
    from .integrations.alembic import upgrade

    upgrade(args.database_url or settings.database_url)
    return 0


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


#: What the commands need beyond the core (the ``sqlalchemy`` extra); imported when they run.
_SQLALCHEMY_MODULES = frozenset({"sqlalchemy", "alembic"})


@quiet_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 done, 2 an error said in one line on stderr (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reconcile"]:
        from .reconcile.cli import main as reconcile_main

        return int(reconcile_main(argv[1:]))
    parser = argparse.ArgumentParser(prog="outbox", description="halfmoon's transactional outbox",
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("consume", help="run an idempotent consumer")
    c.add_argument("--group", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--handler", required=True,
                   help="module:function taking (session, received), or an @idempotent_consumer handler")
    c.add_argument("--database-url", help="where outbox_consumed_message and the handler's writes live")
    c.add_argument("--broker-url")
    c.add_argument("--batch", type=int, default=16)
    k = sub.add_parser("check", help="answer one check-back by the fencing rule")
    k.add_argument("transaction_id")
    k.add_argument("--group", required=True)
    k.add_argument("--database-url")
    k.add_argument("--broker-url")
    k.add_argument("--send", action="store_true", help="also send the answer to the broker")
    m = sub.add_parser("migrate", help="create or upgrade the framework tables (Alembic)")
    m.add_argument("--database-url")
    p = sub.add_parser("purge", help="delete what retention allows from the framework tables (docs/retention.md)")
    p.add_argument("--database-url", action="append",
                   help="a database to purge (repeatable; default: every database of the settings)")
    p.add_argument("--broker-url", help="the broker to ask which transactions are open")
    p.add_argument("--group", action="append", help="only this producer group's transaction_log rows (repeatable)")
    add_purge_arguments(p)
    sub.add_parser("reconcile", help="the PySpark reconciliation report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = OutboxSettings.from_env()
        commands = {"consume": consume, "check": check, "migrate": migrate, "purge": purge}
        return commands[args.command](args, settings)
    except (OutboxError, BrokerError, SpecImportError) as exc:
        print(f"outbox {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in _SQLALCHEMY_MODULES:
            raise
        print(f"outbox {args.command}: needs SQLAlchemy and Alembic: pip install 'halfmoon[sqlalchemy]'",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
