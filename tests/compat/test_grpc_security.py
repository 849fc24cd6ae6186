"""The gRPC port against hostile and careless callers (issue 21, findings 5, 9 and 10): a
signature is good only around the time it was made, the request is not read before the
signature is checked, garbage costs one log line, TLS is offered, and unsigned connections
never slow a client with the keys."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker_embedded import BrokerClient
from broker_embedded.errors import AuthenticationError
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc._proto import service_pb2 as spb
from broker_embedded.server.grpc.signature import (
    DATE_HEADER,
    SignatureVerifier,
    parse_utc_offsets,
    sign,
)
from tests.server.test_unauthenticated import BOUND_S, raise_open_files

from .conftest import GrpcBroker, start_grpc_broker

SEND = "/apache.rocketmq.v2.MessagingService/SendMessage"
HOUR = 3600


def _signed(secret: str = "s3cret", date: str | None = None) -> tuple[tuple[str, str], ...]:
    date = date if date is not None else time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    authorization = f"MQv2-HMAC-SHA1 Credential=app, SignedHeaders=x-mq-date-time, Signature={sign(secret, date)}"
    return (DATE_HEADER, date), ("authorization", authorization)


def _channel(endpoint: str) -> grpc.Channel:
    """A channel with a connection of its own (channels to one address share one otherwise)."""
    return grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])


def _send(channel: grpc.Channel, request: bytes, metadata: tuple[tuple[str, str], ...]) -> spb.SendMessageResponse:
    call = channel.unary_unary(SEND, request_serializer=lambda raw: raw,
                               response_deserializer=spb.SendMessageResponse.FromString)
    return call(request, metadata=metadata, timeout=30)


def _message(topic: str = "secured") -> bytes:
    return spb.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name=topic), body=b"signed",
        system_properties=pb.SystemProperties(message_id=uuid.uuid4().hex, message_type=pb.NORMAL))]
    ).SerializeToString()


@pytest.fixture
def signed_broker(tmp_path: Path) -> Iterator[GrpcBroker]:
    broker = start_grpc_broker(tmp_path / "broker", "--access-key", "app", "--secret-key", "s3cret")
    yield broker
    broker.process.stop()


def _refused(channel: grpc.Channel, request: bytes, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        _send(channel, request, metadata)
    return refused.value


# -- finding 9: signatures expire ----------------------------------------------------------
def test_a_signature_is_good_only_around_when_it_was_made(signed_broker: GrpcBroker) -> None:
    with _channel(signed_broker.endpoint) as channel:
        assert _send(channel, _message(), _signed()).status.code == pb.OK
        for date in ("19700101T000000Z", "anything", "20991231T235959Z"):
            refusal = _refused(channel, _message(), _signed(date=date))
            assert refusal.code() is grpc.StatusCode.UNAUTHENTICATED, date
        in_shanghai = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 8 * HOUR))  # the clients' local time
        assert _send(channel, _message(), _signed(date=in_shanghai)).status.code == pb.OK


def test_the_date_is_checked_in_each_accepted_zone() -> None:
    verifier = SignatureVerifier("app", "s3cret")
    made = 1_800_000_000  # 2027-01-15T08:00:00 UTC
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(made + 5 * HOUR + 45 * 60))  # signed in Kathmandu
    metadata = dict(_signed(date=date))
    for now in (made, made + 299, made - 299):
        verifier.verify(metadata, now=now)
    for now in (made + 301, made + 30 * 60, made + 27 * HOUR):
        with pytest.raises(AuthenticationError, match="not within"):
            verifier.verify(metadata, now=now)
    only_utc = SignatureVerifier("app", "s3cret", utc_offsets=parse_utc_offsets("+00:00"))
    with pytest.raises(AuthenticationError):
        only_utc.verify(metadata, now=made)
    assert parse_utc_offsets("+05:45,-03:30,+0") == (-210, 0, 345)
    for wrong in ("+15:00", "GMT", "+5:4"):
        with pytest.raises(ValueError):
            parse_utc_offsets(wrong)


# -- finding 10: the signature before the request ------------------------------------------
def test_garbage_is_refused_before_it_is_decoded_and_costs_no_tracebacks(signed_broker: GrpcBroker) -> None:
    garbage = b"\xff\x00garbage" * 10
    logged = signed_broker.process.log.stat().st_size
    with _channel(signed_broker.endpoint) as channel:
        codes = {_refused(channel, garbage, ()).code() for _ in range(1000)}
        assert codes == {grpc.StatusCode.UNAUTHENTICATED}
        malformed = {_refused(channel, garbage, _signed()).code() for _ in range(100)}
        assert malformed == {grpc.StatusCode.INVALID_ARGUMENT}
        assert _send(channel, _message(), _signed()).status.code == pb.OK
    log = signed_broker.process.log.read_bytes()[logged:]
    assert b"Traceback" not in log
    assert len(log) < 10_000, f"{len(log)} bytes logged for 1,100 bad calls"


# -- TLS ------------------------------------------------------------------------------------
OFFICIAL_CLIENT = textwrap.dedent("""
    import sys
    import rocketmq

    endpoint, topic = sys.argv[1:]
    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials("app", "s3cret"))
    producer = rocketmq.Producer(config, (topic,), tls_enable=True)
    producer.startup()
    try:
        message = rocketmq.Message()
        message.topic, message.body = topic, b"over TLS"
        print(producer.send(message).message_id)
    finally:
        producer.shutdown()
""")


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_the_official_client_connects_over_tls_and_plaintext_is_refused(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    broker = start_grpc_broker(tmp_path / "broker", "--access-key", "app", "--secret-key", "s3cret",
                               "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key))
    try:
        home = tmp_path / "home"
        home.mkdir()
        sent = subprocess.run(
            [sys.executable, "-c", OFFICIAL_CLIENT, broker.endpoint, "over-tls"], capture_output=True, timeout=120,
            env={**os.environ, "HOME": str(home), "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)})
        assert sent.returncode == 0, sent.stderr.decode()[-2000:]
        with BrokerClient(broker.process.url, access_key="app", secret_key="s3cret") as native:
            stored = native.query_by_id(sent.stdout.decode().strip())
            assert stored is not None and stored.message.body == b"over TLS"
        with _channel(broker.endpoint) as plaintext:
            assert _refused(plaintext, _message(), _signed()).code() is grpc.StatusCode.UNAVAILABLE
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(broker.endpoint, credentials) as secure:
            assert _send(secure, _message(), _signed()).status.code == pb.OK
    finally:
        broker.process.stop()


# -- finding 5 on the gRPC port ----------------------------------------------------------------
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS


def _unsigned_flood(endpoint: str, stop: threading.Event) -> None:
    """Unsigned calls, one after another on a few connections of their own, until ``stop``."""
    channels = [_channel(endpoint) for _ in range(4)]
    try:
        while not stop.is_set():
            for channel in channels:
                try:
                    _send(channel, b"\xff" * 64, ())
                except grpc.RpcError:
                    pass
    finally:
        for channel in channels:
            channel.close()


@pytest.mark.slow
def test_two_thousand_unsigned_connections_never_delay_the_keys(signed_broker: GrpcBroker) -> None:
    raise_open_files(5000)
    port = signed_broker.grpc_port

    def connect_and_send() -> float:
        started = time.monotonic()
        with _channel(signed_broker.endpoint) as channel:
            assert _send(channel, _message("attacked"), _signed()).status.code == pb.OK
        return time.monotonic() - started

    connect_and_send()
    stop = threading.Event()
    flood = threading.Thread(target=_unsigned_flood, args=(signed_broker.endpoint, stop))
    flood.start()
    attack: list[socket.socket] = []
    durations: list[Any] = []
    try:
        for wave in range(4):  # 500 connections a wave: silent ones, then ones that only say hello in HTTP/2
            for _ in range(500):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                if wave % 2:
                    sock.sendall(PREFACE)
                attack.append(sock)
            durations.append(connect_and_send())
    finally:
        stop.set()
        flood.join()
        for sock in attack:
            sock.close()
    assert max(durations) < BOUND_S, f"connect and send took {max(durations):.2f}s under attack"
