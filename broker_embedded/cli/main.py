"""``python -m broker_embedded`` (or ``halfmoon-broker``): run the server and administer it.

    serve   --data-dir DIR [--host 127.0.0.1] [--port 9876] [--flush sync|async]
            [--scrub-rate 16] [--scrub-interval 86400]
            [--checker module:factory] [--access-key K --secret-key S] [--export-root DIR]
            [--max-connections 1024] [--idle-timeout 300] [--http-port P [--http-host 127.0.0.1]
            [--metrics-token T] [--http-trusted-proxy ADDR] [--http-insecure]]
            [--grpc-port P [--grpc-host H] [--grpc-advertise HOST:PORT[,HOST:PORT...]]
             [--grpc-tls-cert PEM --grpc-tls-key PEM] [--grpc-client-utc-offsets +HH:MM[,...]]
             [--grpc-fifo-groups GROUP[,GROUP...]] [--grpc-push-invisible-s S]
             [--grpc-client-gone-after-s S]]
    topics  create NAME [--queues N] | list
    stats   [--json]
    send    TOPIC BODY [--key K] [--tag T] [--delay-level N]
    receive GROUP TOPIC [--batch-size N] [--wait S] [--no-ack] [--filter EXPR] [--filter-type TAG|SQL92]
    query   (--id ID | --topic T --key K) [--json]
    tx      state ID
    parked  list | resolve ID [--wait S] | resolve ID commit|rollback --force | recheck ID
    dlq     list GROUP | resend GROUP ID
    groups  delete GROUP | reset GROUP TOPIC --to end|start|TIME
    export  --out DIR [--format parquet|jsonl]   (over TCP: DIR under the server's export root)
    fsck    --data-dir DIR [--json]      check a stopped broker's files (exit 1: problems)
    repair  --data-dir DIR [--json]      salvage them (exit 1: records were lost)
    losses  --data-dir DIR [--acknowledge [ID ...]] [--json]
                                         the loss ledger (exit 1: open losses remain)

``parked resolve ID`` asks the checker of the transaction's producer group (one check-back:
the fenced transaction_log decides) and applies its answer; when no checker answers it
says so and changes nothing. ``--force`` records the given resolution without reading the
transaction_log, with a warning.

Admin commands talk to a running server (``--broker-url tcp://127.0.0.1:9876``, or the
``HALFMOON_BROKER_URL`` environment variable) or open a stopped broker's ``--data-dir``.
``stats`` and ``query`` print a table, or JSON with ``--json``; ``groups`` a sentence; the
other commands print JSON.
Former spellings still work, unlisted: ``--url`` (``--broker-url``), ``--max`` (``--batch-size``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..api import DEFAULT_PORT, FORCE_WARNINGS, BrokerAPI, BrokerStats
from ..broker.config import BrokerConfig, ServerLimits
from ..broker.facade import EmbeddedBroker
from ..broker.transactions.names import TransactionNames
from ..cli_tools import (
    CommandParser,
    hidden_alias,
    load_attribute,
    non_negative_float,
    port_number,
    positive_int,
    quiet_on_broken_pipe,
    seconds_in,
    table,
)
from ..errors import BrokerError, UnknownGroupError, UnknownTopicError, UnknownTransactionError
from ..filters import SQL92, TAG
from ..http.readiness import Readiness
from ..message import Message, Resolution, StoredMessage
from ..server.tcp import BrokerServer, run_server
from ..store.config import StoreConfig
from ..store.repair import repair
from ..store.verify import acknowledge_losses, check, list_losses

if TYPE_CHECKING:  # prometheus_client comes with the [server] extra, needed for --http-port only
    from ..http.port import HttpPort
    from ..server.grpc.front import (
        GrpcFront,  # grpcio comes with the [grpc] extra, for --grpc-port only
    )

#: The exit statuses, as --help shows them.
EXIT_STATUS = """exit status:
  0    done (an empty list from topics/parked/dlq list or receive is not an error)
  1    not found: the message, key, transaction, topic or group named does not exist
       (query, tx state, parked resolve/recheck, dlq resend, groups delete/reset); one line "not found: ..." on stderr.
       fsck: problems found; repair: records were lost; losses: open losses remain
  2    usage, configuration or broker error; one line "error: Type: reason" on stderr
  141  the output pipe closed early (halfmoon-broker stats | head): nothing more is written
"""
EXIT_NOT_FOUND = 1
EXIT_ERROR = 2
#: A message body longer than this is cut in ``query``'s table (``--json`` prints it whole).
TABLE_BODY_CHARS = 60


class NotFoundError(LookupError):
    """A lookup named something the broker does not have."""


#: Broker errors that mean the same: what was named does not exist.
NOT_FOUND_ERRORS = (NotFoundError, UnknownTransactionError, UnknownTopicError, UnknownGroupError)


def tune_gc_for_server() -> None:
    """A long-lived server allocates many short-lived objects per request and few cycles:
    move what start-up built out of the collector's reach and collect young objects less
    often (the default thresholds cost 13-18 % of the server's CPU under load)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def _http_port(args: argparse.Namespace, readiness: Readiness) -> HttpPort:
    """The HTTP port of ``serve --http-port``, started before the broker opens: /healthz
    answers and /readyz says 503 while the store recovers."""
    try:
        from prometheus_client import CollectorRegistry

        from ..http.port import HttpPort, MetricsAccess, check_exposure
    except ImportError as exc:
        raise ValueError(f"--http-port needs prometheus_client and waitress (pip install 'halfmoon[server]'): "
                         f"{exc}") from None
    from ..http.console import DEFAULT_SESSION_TTL_S
    from ..http.console.session import Sessions

    keys = bool(args.access_key or args.secret_key)
    check_exposure(args.http_host, keys=keys, insecure=args.http_insecure)
    sessions = Sessions(args.access_key, args.secret_key, DEFAULT_SESSION_TTL_S) if keys else None
    port = HttpPort(args.http_host, args.http_port, CollectorRegistry(), readiness.reason,
                    metrics_access=MetricsAccess(args.metrics_token, sessions), trusted_proxy=args.http_trusted_proxy,
                    health=readiness.degraded)
    port.start()
    print(f"halfmoon-broker: HTTP port on {port.url} (the console at {port.url}/, /metrics, /healthz, /readyz)",
          flush=True)
    return port


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = BrokerConfig(
        store=StoreConfig(flush_mode=args.flush, segment_size=args.segment_size,
                          scrub_bytes_per_s=int(args.scrub_rate * 1024 * 1024), scrub_interval_s=args.scrub_interval),
        transaction_timeout_s=args.transaction_timeout,
        check_interval_s=args.check_interval,
        check_max=args.check_max,
        export_root=Path(args.export_root).resolve() if args.export_root else None,
        limits=ServerLimits(max_connections=args.max_connections, idle_timeout_s=args.idle_timeout),
    )
    factory: Any = load_attribute(args.checker, "--checker") if args.checker else None
    _check_grpc_options(args)
    readiness = Readiness()
    http = _http_port(args, readiness) if args.http_port is not None else None
    try:
        return _serve_broker(args, config, factory, http, readiness)
    finally:
        if http is not None:
            http.stop()


def _serve_broker(args: argparse.Namespace, config: BrokerConfig, factory: Any, http: HttpPort | None,
                  readiness: Readiness) -> int:
    """Open the broker, serve it until SIGTERM or SIGINT, close it."""
    broker = EmbeddedBroker(args.data_dir, config)
    if factory is not None:
        broker.set_checker(factory(broker))
    server = BrokerServer(broker, args.host, args.port, args.access_key, args.secret_key)
    if http is not None:
        from ..http.console import make_console_app
        from ..http.metrics import register_broker_metrics

        register_broker_metrics(http.registry, broker, lambda: server.connections)
        http.mount("/", make_console_app(broker, access_key=args.access_key, secret_key=args.secret_key))
    grpc_front = _grpc_front(args, broker)
    readiness.broker = broker
    tune_gc_for_server()

    def listening(now: bool) -> None:
        readiness.listening = now

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if grpc_front is None:
            await run_server(server, stop, listening)
            return
        await grpc_front.start()
        print(f"halfmoon-broker: gRPC (RocketMQ 5) port on {grpc_front.host}:{grpc_front.port}", flush=True)
        try:
            await run_server(server, stop, listening)
        finally:
            await grpc_front.stop()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    finally:
        broker.close()
    return 0


def _check_grpc_options(args: argparse.Namespace) -> None:
    """``ValueError`` before the broker opens if ``--grpc-port`` cannot be served: grpcio
    or protobuf missing, or a malformed ``--grpc-advertise``."""
    grpc_only = (args.grpc_advertise, args.grpc_host, args.grpc_tls_cert, args.grpc_tls_key,
                 args.grpc_client_utc_offsets, args.grpc_fifo_groups, args.grpc_push_invisible_s,
                 args.grpc_client_gone_after_s)
    if args.grpc_port is None:
        if any(option is not None for option in grpc_only):
            raise ValueError("--grpc-host, --grpc-advertise, --grpc-tls-* and the other gRPC options "
                             "(--grpc-client-utc-offsets, --grpc-fifo-groups, --grpc-push-invisible-s, "
                             "--grpc-client-gone-after-s) need --grpc-port")
        return
    try:
        from ..server.grpc.front import parse_advertised
        from ..server.grpc.signature import parse_utc_offsets
    except ImportError as exc:
        raise ValueError(f"--grpc-port needs grpcio and protobuf (pip install 'halfmoon[grpc]'): {exc}") from None
    if args.grpc_advertise is not None:
        parse_advertised(args.grpc_advertise)
    if args.grpc_client_utc_offsets is not None:
        parse_utc_offsets(args.grpc_client_utc_offsets)
    if (args.grpc_tls_cert is None) != (args.grpc_tls_key is None):
        raise ValueError("--grpc-tls-cert and --grpc-tls-key go together")


def _grpc_front(args: argparse.Namespace, broker: EmbeddedBroker) -> GrpcFront | None:
    """The RocketMQ 5 gRPC port of ``serve --grpc-port``, or None when not asked for."""
    if args.grpc_port is None:
        return None
    from ..server.grpc.front import GrpcFront, parse_advertised
    from ..server.grpc.renewal import GONE_AFTER_S
    from ..server.grpc.service import DEFAULT_INVISIBLE_S
    from ..server.grpc.signature import UTC_OFFSETS_MIN, parse_utc_offsets

    advertise = parse_advertised(args.grpc_advertise) if args.grpc_advertise else ()
    offsets = parse_utc_offsets(args.grpc_client_utc_offsets) if args.grpc_client_utc_offsets else UTC_OFFSETS_MIN
    return GrpcFront(broker, args.grpc_host or args.host, args.grpc_port, advertise=advertise,
                     access_key=args.access_key, secret_key=args.secret_key, utc_offsets=offsets,
                     tls_cert=args.grpc_tls_cert, tls_key=args.grpc_tls_key,
                     fifo_groups=[group.strip() for group in (args.grpc_fifo_groups or "").split(",") if group.strip()],
                     push_invisible_s=args.grpc_push_invisible_s or DEFAULT_INVISIBLE_S,
                     client_gone_after_s=args.grpc_client_gone_after_s or GONE_AFTER_S)


def _broker(args: argparse.Namespace) -> BrokerAPI:
    if args.data_dir:
        return EmbeddedBroker(args.data_dir)
    from ..client.tcp import BrokerClient

    return BrokerClient(args.broker_url, access_key=args.access_key, secret_key=args.secret_key)


def _print(value: Any, as_json: bool = True, as_table: Callable[[Any], str] | None = None) -> None:
    """``value`` as JSON, or through ``as_table`` when given and ``as_json`` is False."""
    if as_table is not None and not as_json:
        print(as_table(value))
        return

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {k: plain(x) for k, x in dataclasses.asdict(v).items()}
        if isinstance(v, msgspec.Struct):
            return {k: plain(getattr(v, k)) for k in v.__struct_fields__}
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


def stats_table(stats: BrokerStats) -> str:
    """``stats`` for a person: topics and their depths, the transaction counts, lag per
    consumer group, dead letters and producer groups without a checker."""
    parts = [table(["topic", "queues", "messages", "per queue"],
                   [(t.name, t.queues, sum(t.depth), " ".join(map(str, t.depth))) for t in stats.topics]),
             table(["transactions", "count"], [("pending half messages", stats.pending_half), ("parked", stats.parked),
                                               ("checks outstanding", stats.outstanding_checks)])]
    lag = [(group, topic, n) for group, topics in stats.consumer_lag.items() for topic, n in topics.items()]
    if lag:
        parts.append(table(["consumer group", "topic", "lag"], lag))
    if stats.dlq_depth:
        parts.append(table(["consumer group", "dead letters"], stats.dlq_depth.items()))
    if stats.unanswered_check_groups:
        parts.append(table(["producer group no checker answers", "for (s)"], stats.unanswered_check_groups.items()))
    if stats.extra:
        parts.append(table(["other", "value"], stats.extra.items()))
    return "\n\n".join(parts)


def messages_table(found: StoredMessage | list[StoredMessage]) -> str:
    """Messages found by ``query``, one a line, the body cut at ``TABLE_BODY_CHARS``."""
    def body(data: bytes) -> str:
        text = bytes(data).decode("utf-8", "replace")
        return text if len(text) <= TABLE_BODY_CHARS else text[:TABLE_BODY_CHARS - 3] + "..."

    def stored(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")

    return table(["message id", "topic", "queue:offset", "stored at (UTC)", "keys", "tag", "transaction", "body"],
                 [(s.message.message_id, s.message.topic, f"{s.queue_id}:{s.queue_offset}",
                   stored(s.store_timestamp_ms), ",".join(s.message.keys), s.message.tag, s.transaction_id or "",
                   body(s.message.body)) for s in (found if isinstance(found, list) else [found])])


def admin(args: argparse.Namespace) -> int:
    broker = _broker(args)
    try:
        command = args.command
        if command == "topics":
            _print(broker.create_topic(args.name, args.queues) if args.action == "create" else broker.list_topics())
        elif command == "stats":
            _print(broker.stats(), args.json, stats_table)
        elif command == "send":
            message = Message(args.topic, args.body.encode(), keys=tuple(args.key), tag=args.tag,
                              delay_level=args.delay_level)
            _print(broker.send(message))
        elif command == "receive":
            received = broker.receive(args.group, args.topic, max_messages=args.batch_size, wait_s=args.wait,
                                      filter_expression=args.filter, filter_type=args.filter_type)
            for item in received:
                if not args.no_ack:
                    broker.ack(args.group, item.receipt_handle)
            _print(received)
        elif command == "query":
            found = broker.query_by_id(args.id) if args.id else broker.query_by_key(args.topic, args.key)
            if not found:
                raise NotFoundError(f"no message with id {args.id!r}" if args.id
                                    else f"no message with key {args.key!r} in topic {args.topic!r}")
            _print(found, args.json, messages_table)
        elif command == "tx":
            _print(broker.transaction_state(args.id))
        elif command == "parked":
            if args.action == "list":
                _print(broker.list_parked())
            elif args.action == "resolve" and args.force:
                resolution = Resolution(args.resolution)
                print("WARNING: " + FORCE_WARNINGS[resolution].format(id=args.id), file=sys.stderr)
                _print(broker.resolve_parked(args.id, force=resolution))
            elif args.action == "resolve":
                _print(broker.resolve_parked(args.id, wait_s=args.wait))
            else:
                broker.recheck_parked(args.id)
                print(f"transaction {args.id} is under check again")
        elif command == "groups" and args.action == "delete":
            deleted = broker.delete_group(args.group)
            print(f"consumer group {deleted.group} deleted: its progress in {deleted.queues} queue(s) and "
                  f"{deleted.dead_letters} dead letter(s) forgotten")
        elif command == "groups":
            reset = broker.reset_group(args.group, args.topic, None if args.to == "end" else args.to)
            print(f"consumer group {reset.group} reset on topic {reset.topic}: {reset.lag} message(s) to "
                  f"receive from its {reset.queues} queue(s)")
        elif command == "dlq":
            _print(broker.list_dlq(args.group) if args.action == "list" else broker.resend_dlq(args.group, args.id))
        elif command == "export":
            if isinstance(broker, EmbeddedBroker):
                from ..broker.export import export_messages

                _print(export_messages(broker, os.path.abspath(args.out), args.format))
            else:  # DIR is on the server's machine, under its export root
                _print(broker.export(args.out, args.format))  # type: ignore[attr-defined]
        return 0
    finally:
        broker.close()


def store_tool(args: argparse.Namespace) -> int:
    """``fsck`` (read only; 1 when it finds problems), ``repair`` (1 when records were
    lost) or ``losses`` (1 while open losses remain) of a stopped broker's data directory."""
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"no data directory {data_dir}")
    if args.command == "fsck":
        found = check(data_dir, TransactionNames())
        lines, as_json, code = found.lines(), found.to_json(), 0 if found.ok else 1
    elif args.command == "losses":
        if args.acknowledge is not None:
            acknowledge_losses(data_dir, args.acknowledge or None)
        ledger = list_losses(data_dir)
        lines, as_json, code = ledger.lines(), ledger.to_json(), 1 if ledger.open or ledger.unreadable else 0
    else:
        repaired = repair(data_dir, TransactionNames())
        lines, as_json, code = repaired.lines(), repaired.to_json(), 1 if repaired.lost_records else 0
    print(json.dumps(as_json, indent=2) if args.json else "\n".join(lines))
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="halfmoon-broker", description="halfmoon's embedded broker", epilog=EXIT_STATUS)
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the broker as a TCP server")
    s.add_argument("--data-dir", required=True, help="the broker's folder (created if missing; one broker at a time)")
    s.add_argument("--host", default="127.0.0.1", help="the native TCP port's address")
    s.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="the native TCP port (0: a free one)")
    s.add_argument("--flush", choices=["sync", "async"], default="sync",
                   help="sync: a send is acknowledged after fsync; async: fsync every 200 ms")
    s.add_argument("--segment-size", type=positive_int, default=StoreConfig.segment_size,
                   help="bytes per commit log segment file")
    s.add_argument("--scrub-rate", type=non_negative_float, default=StoreConfig.scrub_bytes_per_s / 2**20,
                   metavar="MIB_PER_S", help="how fast the background scrub re-reads the commit log to find "
                   "damaged records (MiB/s; 0: no scrub)")
    s.add_argument("--scrub-interval", type=non_negative_float, default=StoreConfig.scrub_interval_s,
                   metavar="SECONDS", help="seconds between the end of one scrub pass and the next (the first "
                   "starts at open)")
    s.add_argument("--transaction-timeout", type=non_negative_float, default=6.0,
                   help="seconds before an unresolved half message is first checked back")
    s.add_argument("--check-interval", type=non_negative_float, default=5.0, help="seconds between check-backs")
    s.add_argument("--check-max", type=positive_int, default=15, help="check-backs before a transaction is parked")
    s.add_argument("--export-root", help="the only directory EXPORT_MESSAGES may write under "
                   "(default: DATA_DIR/exports)")
    s.add_argument("--max-connections", type=positive_int, default=ServerLimits.max_connections,
                   help="TCP connections served at once; more wait")
    s.add_argument("--idle-timeout", type=non_negative_float, default=ServerLimits.idle_timeout_s,
                   help="close a connection with nothing in flight after this many seconds without a request")
    s.add_argument("--http-port", type=port_number, help="also serve HTTP on this port (0: a free one): /metrics "
                   "(Prometheus), /healthz, /readyz and the console at /; none unless given")
    s.add_argument("--http-host", default="127.0.0.1", help="the HTTP port's address (default: 127.0.0.1 "
                   "whatever --host is; without keys a non-loopback one needs --http-insecure)")
    s.add_argument("--metrics-token", default=os.environ.get("HALFMOON_METRICS_TOKEN"),
                   help="a bearer token that may read /metrics (default: $HALFMOON_METRICS_TOKEN); given, or with "
                   "keys, /metrics answers only it (or, with keys, a console sign-in)")
    s.add_argument("--http-trusted-proxy", metavar="ADDR", help="the reverse proxy's address: its "
                   "X-Forwarded-For and X-Forwarded-Proto are believed (client address, https)")
    s.add_argument("--http-insecure", action="store_true", help="allow a non-loopback --http-host without "
                   "keys: anyone who reaches it reads message bodies in the console")
    s.add_argument("--grpc-port", type=port_number, help="also serve RocketMQ 5's gRPC protocol (the official clients) "
                   "on this port (0: a free one); none unless given")
    s.add_argument("--grpc-host", help="the gRPC port's address (default: --host)")
    s.add_argument("--grpc-advertise", metavar="HOST:PORT[,HOST:PORT...]", help="the gRPC address routes give "
                   "the clients (default: the address they connected to); several: the brokers of one static route, "
                   "the same list given to each")
    s.add_argument("--grpc-tls-cert", type=Path, help="serve gRPC over TLS only, with this PEM certificate (chain)")
    s.add_argument("--grpc-tls-key", type=Path, help="the PEM private key of --grpc-tls-cert")
    s.add_argument("--grpc-client-utc-offsets", metavar="+HH:MM[,...]", help="the time zones the gRPC clients "
                   "run in (they sign their local time): a signature is then good only within 5 minutes of when "
                   "it was made (default: every zone in use, see docs/rocketmq.md)")
    s.add_argument("--grpc-fifo-groups", metavar="GROUP[,GROUP...]", help="consumer groups whose push consumers "
                   "consume as FIFO groups (RocketMQ's consumeMessageOrderly): the client retries a failed message "
                   "itself, then forwards it to the DLQ")
    s.add_argument("--grpc-push-invisible-s", type=seconds_in(1, 3600), metavar="S",
                   help="seconds a message a push consumer holds stays invisible between the broker's renewals, "
                        "and how soon it comes back after the broker stops renewing it (default: 30)")
    s.add_argument("--grpc-client-gone-after-s", type=seconds_in(1, 3600), metavar="S",
                   help="seconds a push consumer whose stream closed may give no sign of life before the messages "
                        "it holds are released to the group (default: 30; keep it above the clients' 10 s "
                        "heartbeat)")
    s.add_argument("--checker", help="module:factory called with the broker, returning a TransactionChecker "
                   "(e.g. outbox.integrations.celery.checker:make_checker); none: connected producers only")
    s.add_argument("--access-key", help="clients must sign with this key pair (docs/security.md); none: no keys")
    s.add_argument("--secret-key", help="the secret of --access-key")
    s.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="the least level logged on stderr")

    def client_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--broker-url", default=os.environ.get("HALFMOON_BROKER_URL", f"tcp://127.0.0.1:{DEFAULT_PORT}"),
                       help="the running broker ($HALFMOON_BROKER_URL if set)")
        hidden_alias(p, "--url", "broker_url")
        p.add_argument("--data-dir", help="open a stopped broker's folder instead of --broker-url")
        p.add_argument("--access-key", default=os.environ.get("HALFMOON_ACCESS_KEY"),
                       help="sign in with this key pair (default: $HALFMOON_ACCESS_KEY; none: no keys)")
        p.add_argument("--secret-key", default=os.environ.get("HALFMOON_SECRET_KEY"),
                       help="the secret of --access-key (default: $HALFMOON_SECRET_KEY)")

    t = sub.add_parser("topics", help="create or list topics")
    t.add_argument("action", choices=["create", "list"], help="create a topic, or list them")
    t.add_argument("name", nargs="?", help="the topic to create")
    t.add_argument("--queues", type=positive_int, default=4, help="queues of a new topic")
    client_options(t)
    st = sub.add_parser("stats", help="depths, pending half messages, parked, DLQ")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    client_options(st)
    m = sub.add_parser("send", help="send one message")
    m.add_argument("topic", help="the topic to send to")
    m.add_argument("body", help="the message body (UTF-8 text)")
    m.add_argument("--key", action="append", default=[], help="a key to find the message by (repeatable)")
    m.add_argument("--tag", default="", help="the message's tag (default: none)")
    m.add_argument("--delay-level", type=int, default=0, help="RocketMQ delay level 1-18 (1 s to 2 h); 0: none")
    client_options(m)
    r = sub.add_parser("receive", help="receive (and ack) messages for a group")
    r.add_argument("group", help="the consumer group")
    r.add_argument("topic", help="the topic")
    r.add_argument("--batch-size", type=positive_int, default=16, help="messages received at most")
    hidden_alias(r, "--max", "batch_size", type=positive_int)
    r.add_argument("--wait", type=non_negative_float, default=0.0, help="seconds to wait for a first message")
    r.add_argument("--no-ack", action="store_true", help="leave them unacknowledged (they come back later)")
    r.add_argument("--filter", default="*", metavar="EXPR",
                   help="RocketMQ filter: a TAG expression, '*' (default), 'TagA' or 'TagA || TagB', or with "
                        "--filter-type SQL92 a condition over the properties; the group skips the rest")
    r.add_argument("--filter-type", choices=(TAG, SQL92), default=TAG, help="what --filter is (default: TAG)")
    client_options(r)
    q = sub.add_parser("query", help="find messages by id or key")
    q.add_argument("--id", help="the message id")
    q.add_argument("--topic", help="the topic of --key")
    q.add_argument("--key", help="a key the messages carry")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    client_options(q)
    x = sub.add_parser("tx", help="a transaction's state")
    x.add_argument("action", choices=["state"], help="what to show")
    x.add_argument("id", help="the transaction id")
    client_options(x)
    p = sub.add_parser("parked", help="transactions parked after check_max checks")
    p.add_argument("action", choices=["list", "resolve", "recheck"],
                   help="list them; resolve one by its checker (or --force); recheck: check it again")
    p.add_argument("id", nargs="?", help="the transaction id (resolve, recheck)")
    p.add_argument("resolution", nargs="?", choices=["commit", "rollback"],
                   help="with --force: record this resolution without a check-back")
    p.add_argument("--force", action="store_true",
                   help="skip the check-back and its transaction_log (may deliver a phantom)")
    p.add_argument("--wait", type=float, default=10.0,
                   help="seconds to wait for the checker's answer")
    client_options(p)
    d = sub.add_parser("dlq", help="dead-lettered messages of a group")
    d.add_argument("action", choices=["list", "resend"], help="list the dead letters, or resend one")
    d.add_argument("group", help="the consumer group")
    d.add_argument("id", nargs="?", help="the message id to resend")
    client_options(d)
    g = sub.add_parser("groups", help="delete a consumer group no longer used, or move it on a topic")
    g.add_argument("action", choices=["delete", "reset"],
                   help="delete: forget the group's progress, lag and dead letters; reset: move it on TOPIC "
                        "(--to); both refused while it consumes")
    g.add_argument("group", help="the consumer group")
    g.add_argument("topic", nargs="?", help="reset: the topic to move the group on")
    g.add_argument("--to", type=reset_point, metavar="end|start|TIME",
                   help="reset: end skips every message stored so far; start delivers again every one kept; an "
                        "ISO 8601 time (2026-11-30T12:00:00Z) those stored since")
    client_options(g)
    e = sub.add_parser("export", help="export messages and deliveries for reconciliation")
    e.add_argument("--out", required=True, help="with --url: relative to the server's export root, "
                   "or an absolute path inside it")
    e.add_argument("--format", choices=["parquet", "jsonl"], default="parquet", help="the files' format")
    client_options(e)
    for name, text in (("fsck", "check a stopped broker's data directory (read only)"),
                       ("repair", "salvage a damaged data directory of a stopped broker")):
        f = sub.add_parser(name, help=text)
        f.add_argument("--data-dir", required=True, help="the stopped broker's folder")
        f.add_argument("--json", action="store_true", help="print the report as JSON")
    ledger = sub.add_parser("losses", help="the records recovery, repair or the scrub found destroyed")
    ledger.add_argument("--data-dir", required=True, help="the stopped broker's folder")
    ledger.add_argument("--acknowledge", nargs="*", type=int, metavar="ID",
                        help="mark these losses (all open ones without IDs) as dealt with")
    ledger.add_argument("--json", action="store_true", help="print the ledger as JSON")
    return parser


def reset_point(text: str) -> int | str:
    """An argparse type: where ``groups reset`` moves a group: ``end``, ``start`` (0) or an
    ISO 8601 time (UTC unless it names its offset) as epoch milliseconds."""
    if text in ("end", "start"):
        return 0 if text == "start" else text
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not end, start or an ISO 8601 time") from None
    return round((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The argument combinations argparse cannot express."""
    command, action = args.command, getattr(args, "action", None)
    if command == "topics" and action == "create" and not args.name:
        parser.error("topics create needs a topic NAME")
    if command == "query" and not (args.id or (args.topic and args.key)):
        parser.error("query needs --id ID, or --topic T and --key K")
    if command == "parked" and action in ("resolve", "recheck") and not args.id:
        parser.error(f"parked {action} needs a transaction ID")
    if command == "parked" and action == "resolve" and bool(args.resolution) != args.force:
        parser.error("parked resolve ID asks the producer group's checker; to record commit or rollback "
                     "without it, give both the resolution and --force")
    if command == "dlq" and action == "resend" and not args.id:
        parser.error("dlq resend needs a message ID")
    if command == "groups" and action == "reset" and (not args.topic or args.to is None):
        parser.error("groups reset needs a TOPIC and --to end|start|TIME")
    if command == "groups" and action == "delete" and (args.topic or args.to is not None):
        parser.error("groups delete takes the group alone")


@quiet_on_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status is in ``EXIT_STATUS``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    try:
        if args.command in ("fsck", "repair", "losses"):
            return store_tool(args)
        return serve(args) if args.command == "serve" else admin(args)
    except BrokenPipeError:
        raise  # an OSError, but not a failure: quiet_on_broken_pipe ends the command
    except NOT_FOUND_ERRORS as exc:
        print(f"not found: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except (BrokerError, ValueError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
