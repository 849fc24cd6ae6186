"""``python -m broker_embedded`` (or ``halfmoon-broker``): run the server and administer it.

    serve   --data-dir DIR [--host 127.0.0.1] [--port 9876] [--flush sync|async]
            [--checker module:factory] [--access-key K --secret-key S]
    topics  create NAME [--queues N] | list
    stats
    send    TOPIC BODY [--key K] [--tag T] [--delay-level N]
    receive GROUP TOPIC [--max N] [--wait S] [--no-ack]
    query   --id ID | --topic T --key K
    tx      state ID
    parked  list | resolve ID commit|rollback | recheck ID
    dlq     list GROUP | resend GROUP ID
    export  --out DIR [--format parquet|jsonl]

Admin commands talk to a running server (``--url tcp://127.0.0.1:9876``, or the
``HALFMOON_BROKER_URL`` environment variable) or open a stopped broker's ``--data-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .api import BrokerAPI
from .broker import EmbeddedBroker
from .config import BrokerConfig
from .errors import BrokerError
from .message import Message, Resolution
from .server import BrokerServer, run_server
from .store.config import StoreConfig


def _load_checker_factory(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise SystemExit(f"--checker must be module:factory, got {spec!r}")
    return getattr(importlib.import_module(module_name), attribute)


def tune_gc_for_server() -> None:
    """A long-lived server allocates many short-lived objects per request and few cycles:
    move what start-up built out of the collector's reach and collect young objects less
    often (the default thresholds cost 13-18 % of the server's CPU under load)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = BrokerConfig(
        store=StoreConfig(flush_mode=args.flush, segment_size=args.segment_size),
        transaction_timeout_s=args.transaction_timeout,
        check_interval_s=args.check_interval,
        check_max=args.check_max,
    )
    broker = EmbeddedBroker(args.data_dir, config)
    if args.checker:
        broker.set_checker(_load_checker_factory(args.checker)(broker))
    server = BrokerServer(broker, args.host, args.port, args.access_key, args.secret_key)
    tune_gc_for_server()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_server(server, stop)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    finally:
        broker.close()
    return 0


def _broker(args: argparse.Namespace) -> BrokerAPI:
    if args.data_dir:
        return EmbeddedBroker(args.data_dir)
    from .client import BrokerClient

    return BrokerClient(args.url, access_key=args.access_key, secret_key=args.secret_key)


def _print(value: Any) -> None:
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {k: plain(x) for k, x in dataclasses.asdict(v).items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if hasattr(v, "value"):
            return v.value
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    print(json.dumps(plain(value), indent=2, default=str))


def admin(args: argparse.Namespace) -> int:
    broker = _broker(args)
    try:
        command = args.command
        if command == "topics":
            _print(broker.create_topic(args.name, args.queues) if args.action == "create" else broker.list_topics())
        elif command == "stats":
            _print(broker.stats())
        elif command == "send":
            message = Message(args.topic, args.body.encode(), keys=tuple(args.key), tag=args.tag,
                              delay_level=args.delay_level)
            _print(broker.send(message))
        elif command == "receive":
            received = broker.receive(args.group, args.topic, max_messages=args.max, wait_s=args.wait)
            for item in received:
                if not args.no_ack:
                    broker.ack(args.group, item.receipt_handle)
            _print(received)
        elif command == "query":
            _print(broker.query_by_id(args.id) if args.id else broker.query_by_key(args.topic, args.key))
        elif command == "tx":
            _print(broker.transaction_state(args.id))
        elif command == "parked":
            if args.action == "list":
                _print(broker.list_parked())
            elif args.action == "resolve":
                _print(broker.resolve_parked(args.id, Resolution(args.resolution)))
            else:
                broker.recheck_parked(args.id)
                print(f"transaction {args.id} is under check again")
        elif command == "dlq":
            _print(broker.list_dlq(args.group) if args.action == "list" else broker.resend_dlq(args.group, args.id))
        elif command == "export":
            out = os.path.abspath(args.out)
            if isinstance(broker, EmbeddedBroker):
                from .export import export_messages

                _print(export_messages(broker, out, args.format))
            else:
                _print(broker.export(out, args.format))  # type: ignore[attr-defined]
        return 0
    finally:
        broker.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="broker_embedded", description="halfmoon's embedded broker")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the broker as a TCP server")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=9876)
    s.add_argument("--flush", choices=["sync", "async"], default="sync")
    s.add_argument("--segment-size", type=int, default=StoreConfig.segment_size)
    s.add_argument("--transaction-timeout", type=float, default=6.0)
    s.add_argument("--check-interval", type=float, default=5.0)
    s.add_argument("--check-max", type=int, default=15)
    s.add_argument("--checker", help="module:factory called with the broker, returning a TransactionChecker")
    s.add_argument("--access-key")
    s.add_argument("--secret-key")
    s.add_argument("--log-level", default="INFO")

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", default=os.environ.get("HALFMOON_BROKER_URL", "tcp://127.0.0.1:9876"))
        p.add_argument("--data-dir", help="open a stopped broker's directory instead of --url")
        p.add_argument("--access-key", default=os.environ.get("HALFMOON_ACCESS_KEY"))
        p.add_argument("--secret-key", default=os.environ.get("HALFMOON_SECRET_KEY"))

    t = sub.add_parser("topics", help="create or list topics")
    t.add_argument("action", choices=["create", "list"])
    t.add_argument("name", nargs="?")
    t.add_argument("--queues", type=int, default=4)
    client_options(t)
    client_options(sub.add_parser("stats", help="depths, pending half messages, parked, DLQ"))
    m = sub.add_parser("send", help="send one message")
    m.add_argument("topic")
    m.add_argument("body")
    m.add_argument("--key", action="append", default=[])
    m.add_argument("--tag", default="")
    m.add_argument("--delay-level", type=int, default=0)
    client_options(m)
    r = sub.add_parser("receive", help="receive (and ack) messages for a group")
    r.add_argument("group")
    r.add_argument("topic")
    r.add_argument("--max", type=int, default=16)
    r.add_argument("--wait", type=float, default=0.0)
    r.add_argument("--no-ack", action="store_true")
    client_options(r)
    q = sub.add_parser("query", help="find messages by id or key")
    q.add_argument("--id")
    q.add_argument("--topic")
    q.add_argument("--key")
    client_options(q)
    x = sub.add_parser("tx", help="a transaction's state")
    x.add_argument("action", choices=["state"])
    x.add_argument("id")
    client_options(x)
    p = sub.add_parser("parked", help="transactions parked after check_max checks")
    p.add_argument("action", choices=["list", "resolve", "recheck"])
    p.add_argument("id", nargs="?")
    p.add_argument("resolution", nargs="?", choices=["commit", "rollback"])
    client_options(p)
    d = sub.add_parser("dlq", help="dead-lettered messages of a group")
    d.add_argument("action", choices=["list", "resend"])
    d.add_argument("group")
    d.add_argument("id", nargs="?")
    client_options(d)
    e = sub.add_parser("export", help="export messages and deliveries for reconciliation")
    e.add_argument("--out", required=True)
    e.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    client_options(e)
    return parser


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The argument combinations argparse cannot express."""
    command, action = args.command, getattr(args, "action", None)
    if command == "topics" and action == "create" and not args.name:
        parser.error("topics create needs a topic NAME")
    if command == "query" and not (args.id or (args.topic and args.key)):
        parser.error("query needs --id ID, or --topic T and --key K")
    if command == "parked" and action in ("resolve", "recheck") and not args.id:
        parser.error(f"parked {action} needs a transaction ID")
    if command == "parked" and action == "resolve" and not args.resolution:
        parser.error("parked resolve needs commit or rollback")
    if command == "dlq" and action == "resend" and not args.id:
        parser.error("dlq resend needs a message ID")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    try:
        return serve(args) if args.command == "serve" else admin(args)
    except (BrokerError, ValueError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
