"""The gRPC port of ``halfmoon-broker serve --grpc-port``: a ``grpc.aio`` server on the
broker server's event loop, serving ``MessagingService`` over the same broker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ...api import BrokerAPI
from ...broker.config import BrokerConfig
from .renewal import GONE_AFTER_S
from .service import DEFAULT_INVISIBLE_S, MessagingService
from .signature import UTC_OFFSETS_MIN, SignatureFirst, SignatureVerifier

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
#: How often held messages are looked at for renewal (at most; a tenth of their invisibility).
RENEW_TICK_S = 1.0
#: What a gRPC message may hold besides a body of ``max_body_size`` (properties, ids, framing).
MESSAGE_OVERHEAD_BYTES = 1024 * 1024


class GrpcFront:
    """Serve RocketMQ 5's gRPC protocol for ``broker`` on ``host:port`` (0: a free port, see
    ``port`` after ``start``). ``advertise`` (``host:port`` each) are the brokers routes give the
    clients: this one, or all brokers of a static route (default: the address they connected
    to); with ``access_key`` and ``secret_key`` every
    call must be signed with them (``MQv2-HMAC-SHA1``) at a time that is now in one of
    ``utc_offsets`` (minutes; default: every zone in use). With ``tls_cert`` and ``tls_key``
    (PEM files) the port speaks TLS only. A message a push consumer receives is invisible for
    ``push_invisible_s``, renewed until the consumer acks it (RocketMQ's ``auto_renew``) or its
    client gives no sign of life for ``client_gone_after_s`` (then released). Push
    consumers of ``fifo_groups`` are told their group is FIFO (RocketMQ's
    ``consumeMessageOrderly``): they retry a failed message themselves, then forward it to the DLQ."""

    def __init__(self, broker: BrokerAPI, host: str = "127.0.0.1", port: int = 8081, *,
                 advertise: Sequence[str] = (), access_key: str | None = None, secret_key: str | None = None,
                 utc_offsets: Sequence[int] = UTC_OFFSETS_MIN, tls_cert: Path | None = None,
                 tls_key: Path | None = None, max_workers: int = 64,
                 push_invisible_s: float = DEFAULT_INVISIBLE_S, fifo_groups: Collection[str] = (),
                 client_gone_after_s: float = GONE_AFTER_S) -> None:
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("give both a TLS certificate and its key, or neither")
        self.credentials = (grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
                            if tls_cert is not None and tls_key is not None else None)
        for address in advertise:
            check_address(address)
        self.host = host
        self.port = port
        config = getattr(broker, "config", None)
        self.config = config if isinstance(config, BrokerConfig) else BrokerConfig()
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="broker-grpc")
        #: Receives wait for messages on their own threads, so waiting consumers never hold up a send.
        self.poll_executor = ThreadPoolExecutor(max_workers=self.config.limits.max_long_polls,
                                                thread_name_prefix="broker-grpc-poll")
        self.interceptors = [SignatureFirst(SignatureVerifier(access_key, secret_key, utc_offsets=utc_offsets))] \
            if access_key is not None and secret_key is not None else []
        self.service = MessagingService(broker, self.executor, self.poll_executor, advertise, push_invisible_s,
                                        fifo_groups, client_gone_after_s)
        self._server: grpc.aio.Server | None = None
        self._renewing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        largest = self.config.max_body_size + self.config.max_properties_size + MESSAGE_OVERHEAD_BYTES
        limits = self.config.limits
        server = grpc.aio.server(interceptors=self.interceptors, options=[
            ("grpc.max_receive_message_length", largest), ("grpc.max_send_message_length", largest),
            # a connection must finish its (TLS and) HTTP/2 handshake within the native port's
            # deadline to authenticate, and one without a call open is closed when idle
            ("grpc.server_handshake_timeout_ms", int(limits.auth_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(limits.idle_timeout_s * 1000)),
            # a port another process listens on is refused, as the native and HTTP ports do:
            # grpcio's default (SO_REUSEPORT) let a second broker share it, and the kernel
            # spread the clients' connections over both
            ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((self.service.handler(),))
        address = f"{self.host}:{self.port}"
        try:
            self.port = (server.add_insecure_port(address) if self.credentials is None
                         else server.add_secure_port(address, self.credentials))
        except RuntimeError as exc:  # grpcio's way of saying the port is taken or the host unknown
            raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
        await server.start()
        self._server = server
        tick_s = min(RENEW_TICK_S, self.service.renewals.invisible_s / 10)
        self._renewing = asyncio.get_running_loop().create_task(self.service.renewals.run(tick_s))
        log.debug("gRPC (RocketMQ 5) listening on %s:%d", self.host, self.port)  # serve prints it

    async def stop(self) -> None:
        """Stop accepting calls, give those in flight ``STOP_GRACE_S`` to finish."""
        self.service.stopping = True
        self.service.router.end_all()
        if self._renewing is not None:
            self._renewing.cancel()
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
        self.executor.shutdown(wait=True, cancel_futures=False)
        self.poll_executor.shutdown(wait=True, cancel_futures=False)


def check_address(address: str) -> None:
    """``ValueError`` unless ``address`` is ``host:port``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an advertised gRPC address must be host:port, not {address!r}")


def parse_advertised(value: str) -> tuple[str, ...]:
    """The addresses of ``--grpc-advertise HOST:PORT[,HOST:PORT...]`` (``ValueError`` if malformed)."""
    addresses = tuple(address.strip() for address in value.split(","))
    for address in addresses:
        check_address(address)
    return addresses
