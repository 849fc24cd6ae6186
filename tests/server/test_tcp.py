"""The broker over TCP: the API, check-back push, pipelining, auth, bad frames, restarts."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from broker_embedded import BrokerClient, Message, Resolution, TransactionState, connect
from broker_embedded.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    MalformedFrameError,
    ReservedTopicError,
    TransactionConflictError,
    UnknownReceiptError,
    UnknownRequestCodeError,
)
from broker_embedded.wire.protocol import Kind, encode_frame
from tests.ports import free_port
from tests.server.conftest import wait_for_port
from tests.server.wire import decode_frame


def test_round_trip_of_the_api_over_tcp(server_factory) -> None:
    server = server_factory()
    with connect(server.url) as client:
        assert isinstance(client, BrokerClient)
        client.create_topic("orders", 2)
        sent = client.send(Message("orders", b"hello", keys=("k1",), properties={"p": "v"}))
        client.send_half(Message("orders", b"tx"), producer_group="pg", transaction_id="t1")
        assert client.transaction_state("t1") is TransactionState.PENDING
        assert client.end_transaction("t1", Resolution.COMMIT, producer_group="pg").applied
        with pytest.raises(TransactionConflictError):
            client.end_transaction("t1", Resolution.ROLLBACK, producer_group="pg")
        received = client.receive("g", "orders", max_messages=10, wait_s=2)
        assert sorted(r.message.body for r in received) == [b"hello", b"tx"]
        for r in received:
            client.ack("g", r.receipt_handle)
        with pytest.raises(UnknownReceiptError):
            client.ack("g", received[0].receipt_handle)
        found = client.query_by_id(sent.message_id)
        assert found is not None and found.message.properties == {"p": "v"}
        assert [m.message.message_id for m in client.query_by_key("orders", "k1")] == [sent.message_id]
        assert client.read("orders", sent.queue_id, 0, 10)[0].message.body == b"hello"
        assert client.stats().topics[0].name == "orders"
        with pytest.raises(ReservedTopicError):
            client.send(Message("RMQ_SYS_TRANS_HALF_TOPIC", b"x"))


def test_check_back_is_pushed_to_the_producers_connection(server_factory) -> None:
    server = server_factory("--transaction-timeout", "0.3", "--check-interval", "0.3")
    producer = BrokerClient(server.url)
    checks: list[str] = []

    def on_check(request) -> None:
        checks.append(request.transaction_id)
        producer.end_transaction(request.transaction_id, Resolution.COMMIT,
                                 producer_group=request.producer_group, from_check=True)

    producer.register_producer("pg", on_check)
    producer.send_half(Message("orders", b"forgotten"), producer_group="pg", transaction_id="t9")
    with BrokerClient(server.url) as consumer:
        got = consumer.receive("g", "orders", wait_s=10)
    assert [r.message.body for r in got] == [b"forgotten"]
    assert checks == ["t9"]
    producer.close()


def test_many_threads_pipeline_on_one_connection(server_factory) -> None:
    server = server_factory()
    client = BrokerClient(server.url)
    offsets: list[int] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        for i in range(50):
            result = client.send(Message("load", f"{n}-{i}".encode()))
            with lock:
                offsets.append(result.commit_log_offset)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(offsets)) == 400
    assert sum(client.stats().topics[0].depth) == 400
    client.close()


def test_authentication(server_factory) -> None:
    server = server_factory("--access-key", "ak", "--secret-key", "sk")
    with BrokerClient(server.url, access_key="ak", secret_key="sk") as good:
        good.send(Message("orders", b"x"))
    with pytest.raises(AuthenticationError):
        with BrokerClient(server.url, access_key="ak", secret_key="wrong") as bad:
            bad.send(Message("orders", b"x"))
    with pytest.raises(AuthenticationError):
        with BrokerClient(server.url) as anonymous:
            anonymous.send(Message("orders", b"x"))


def _raw_request(sock: socket.socket, frame: bytes) -> tuple[int, int, Kind, object]:
    sock.sendall(frame)
    (length,) = struct.unpack(">I", sock.recv(4))
    data = b""
    while len(data) < length:
        data += sock.recv(length - len(data))
    return decode_frame(data)


def test_bad_frames_get_typed_errors_and_harm_nothing(server_factory) -> None:
    server = server_factory()
    with BrokerClient(server.url) as client:
        kept = client.send(Message("orders", b"kept"))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        _, _, _, body = _raw_request(sock, struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
        assert body["error"][0] == MalformedFrameError.code
        _, _, _, body = _raw_request(sock, encode_frame(424242, 7, Kind.REQUEST, {}))
        assert body["error"][0] == UnknownRequestCodeError.code
        _, _, _, body = _raw_request(sock, encode_frame(10, 8, Kind.REQUEST, {"message": "nonsense"}))
        assert body["error"][0] == MalformedFrameError.code
        _, _, _, body = _raw_request(sock, encode_frame(34, 11, Kind.REQUEST, {"group": "pg"}))
        assert body["error"][0] == MalformedFrameError.code and "producer_group" in body["error"][1]
        _, _, _, body = _raw_request(sock, encode_frame(10, 12, Kind.REQUEST, [1, 2]))
        assert body["error"][0] == MalformedFrameError.code
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        _, _, _, body = _raw_request(sock, struct.pack(">I", 1 << 30))  # an absurd length
        assert body["error"][0] == MalformedFrameError.code and "exceeds" in body["error"][1]
        sock.settimeout(20)
        assert sock.recv(1) == b"", "the server closes a stream it cannot trust"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        _, _, kind, body = _raw_request(sock, encode_frame(10, 9, Kind.RESPONSE, {}))
        assert body["error"][0] == MalformedFrameError.code
        _, request_id, _, body = _raw_request(sock, encode_frame(33, 10, Kind.REQUEST, {"message_id": kept.message_id}))
        assert request_id == 10 and body["ok"]["message"]["body"] == b"kept", "the connection still works"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(struct.pack(">I", 100) + b"truncated")  # then hang up mid-frame
    with BrokerClient(server.url) as client:
        assert client.query_by_id(kept.message_id) is not None


def test_client_reconnects_after_a_server_restart(server_factory) -> None:
    server = server_factory()
    client = BrokerClient(server.url, timeout_s=5)
    client.send(Message("orders", b"before"))
    server.kill()
    with pytest.raises(BrokerUnavailableError):
        client.send(Message("orders", b"while down"))
    server.start()
    client.send(Message("orders", b"after"))
    bodies = [r.message.body for r in client.receive("g", "orders", max_messages=10, wait_s=1)]
    assert sorted(bodies) == [b"after", b"before"]
    client.close()


def test_sigterm_shuts_down_cleanly(server_factory) -> None:
    server = server_factory()
    with BrokerClient(server.url) as client:
        client.send(Message("orders", b"x"))
    assert server.stop() == 0
    assert "broker server stopped" in server.log.read_text()


def test_cli_admin_commands(server_factory, tmp_path) -> None:
    server = server_factory()

    def cli(*args: str, target: tuple[str, ...] = ("--url", server.url)) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "broker_embedded", *args, *target],
                              capture_output=True, text=True, timeout=60)

    assert cli("topics", "create", "orders").returncode == 0
    assert '"name": "orders"' in cli("topics", "list").stdout
    sent = json.loads(cli("send", "orders", "hi", "--key", "k").stdout)
    assert sent["queue_offset"] == 0
    assert json.loads(cli("query", "--id", sent["message_id"], "--json").stdout)["message"]["body"] == "hi"
    assert len(json.loads(cli("query", "--topic", "orders", "--key", "k", "--json").stdout)) == 1
    assert '"body": "hi"' in cli("receive", "g", "orders").stdout
    assert cli("receive", "g", "orders").stdout.strip() == "[]", "receive acks what it prints"
    assert '"orders"' in cli("stats", "--json").stdout
    assert json.loads(cli("parked", "list").stdout) == []
    assert json.loads(cli("dlq", "list", "g").stdout) == []
    failed = cli("tx", "state", "missing")
    assert failed.returncode == 1 and "not found: no transaction" in failed.stderr
    assert json.loads(cli("export", "--out", "remote", "--format", "jsonl").stdout)["messages"] == 1
    assert (server.data_dir / "exports" / "remote" / "deliveries.jsonl").read_text().count("\n") == 1
    assert server.stop() == 0
    offline = ("--data-dir", str(server.data_dir))
    assert json.loads(cli("export", "--out", str(tmp_path / "offline"), target=offline).stdout)["messages"] == 1
    assert (tmp_path / "offline" / "messages.parquet").exists()
    down = cli("stats")
    assert down.returncode == 2 and "BrokerUnavailableError" in down.stderr


def test_serve_reports_a_locked_data_dir_and_a_busy_port(server_factory, tmp_path) -> None:
    """A second broker is refused a running broker's data directory and each of its ports
    (native, HTTP, gRPC): it stops with an error rather than share a port, which would split
    the clients' connections between two brokers (gRPC's SO_REUSEPORT allowed that)."""
    http_port, grpc_port = free_port(), free_port()
    server = server_factory("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    wait_for_port(grpc_port, process=server)

    def serve(data_dir: str, *ports: str) -> tuple[int, str]:
        options = ports if "--port" in ports else ("--port", "0", *ports)
        second = subprocess.Popen([sys.executable, "-m", "broker_embedded", "serve", "--data-dir", data_dir,
                                   *options], stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
            second.communicate()
            raise AssertionError(f"a second broker started on {ports} of a running one") from None
        return second.returncode, stderr

    code, stderr = serve(str(server.data_dir))
    assert code == 2 and "DataDirLockedError" in stderr
    for option, port in (("--port", server.port), ("--http-port", http_port), ("--grpc-port", grpc_port)):
        code, stderr = serve(str(tmp_path / f"other{option}"), option, str(port))
        assert code == 2 and stderr.strip().splitlines()[-1].startswith("error: OSError: "), (option, stderr)
    assert server.proc is not None and server.proc.poll() is None


CLIENT_LOAD = r"""
import sys
from broker_embedded import BrokerClient, Message
client = BrokerClient(sys.argv[1], timeout_s=5)
worker = sys.argv[2]
for n in range(1_000_000):
    try:
        client.send(Message("load", f"{worker}-{n}".encode(), message_id=f"{worker}-{n}"))
    except Exception:
        break
    print(f"{worker}-{n}", flush=True)
"""


@pytest.mark.slow
def test_sigkill_under_sync_load_loses_no_acknowledged_message(server_factory, tmp_path) -> None:
    server = server_factory()
    BrokerClient(server.url).create_topic("load", 4)
    clients = [
        subprocess.Popen([sys.executable, "-c", CLIENT_LOAD, server.url, f"w{n}"],
                         stdout=subprocess.PIPE, text=True)
        for n in range(3)
    ]
    consumed_before: list[str] = []
    consumer = BrokerClient(server.url, timeout_s=5)
    deadline = time.monotonic() + 60
    while len(consumed_before) < 200 and time.monotonic() < deadline:
        # the group consumes (and acks) while the load runs
        for r in consumer.receive("g", "load", max_messages=64, wait_s=0.2):
            consumer.ack("g", r.receipt_handle)
            consumed_before.append(r.message.message_id)
    server.kill()
    consumer.close()
    acknowledged: set[str] = set()
    for proc in clients:
        out, _ = proc.communicate(timeout=60)
        acknowledged.update(out.split())
    assert len(consumed_before) >= 200 and len(acknowledged) >= 200
    server.start()
    with BrokerClient(server.url) as client:
        stored = []
        for q in range(4):  # a read answers as many messages as fit in a frame
            offset = 0
            while batch := client.read("load", q, offset, 1024):
                stored += batch
                offset = batch[-1].queue_offset + 1
        ids = [m.message.message_id for m in stored]
        assert len(ids) == len(set(ids)), "a message is stored twice"
        assert acknowledged <= set(ids), "an acknowledged message was lost"
        torn = [m for m in stored if m.message.body.decode() != m.message.message_id]
        assert not torn, "a torn record is visible"
        client.send(Message("load", b"after", message_id="after"))
        consumed_after: list[str] = []
        while batch := client.receive("g", "load", max_messages=256, wait_s=0.5):
            consumed_after.extend(r.message.message_id for r in batch)
            for r in batch:
                client.ack("g", r.receipt_handle)
        # the group resumes where it was: everything stored reaches it; only the last acks
        # before the kill may come again (consumer progress is flushed lazily by default)
        assert set(consumed_before) | set(consumed_after) == {*ids, "after"}
        assert len(consumed_after) < len(ids) + 1, "the group started over instead of resuming"


def test_sigterm_answers_a_long_poll_and_keeps_acknowledged_sends(server_factory) -> None:
    server = server_factory()
    client = BrokerClient(server.url, timeout_s=60)
    sent = [client.send(Message("orders", str(n).encode())).message_id for n in range(20)]
    outcome: list[object] = []

    def long_poll() -> None:
        try:
            outcome.append(client.receive("g", "empty", wait_s=120))
        except Exception as exc:  # the poll may be cut short with a typed error
            outcome.append(exc)

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)  # let the poll reach the server
    started = time.monotonic()
    assert server.stop() == 0
    poller.join(60)
    assert outcome and time.monotonic() - started < 60, "shutdown waited for the long poll"
    client.close()
    server.start()
    with BrokerClient(server.url) as again:
        assert all(again.query_by_id(message_id) is not None for message_id in sent)


CHECKER_MODULE = '''
import threading
from broker_embedded import Resolution

class CommitEverything:
    """Answers every check-back with COMMIT, from its own thread (request_check must not block)."""

    def __init__(self, broker):
        self.broker = broker

    def request_check(self, request):
        threading.Thread(target=self.broker.end_transaction, args=(request.transaction_id, Resolution.COMMIT),
                         kwargs={"producer_group": request.producer_group, "from_check": True}).start()
        return True

def factory(broker):
    return CommitEverything(broker)
'''


def test_serve_plugs_in_a_checker_factory(server_factory, tmp_path, monkeypatch) -> None:
    (tmp_path / "halfmoon_test_checker.py").write_text(CHECKER_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = server_factory("--checker", "halfmoon_test_checker:factory",
                            "--transaction-timeout", "0.2", "--check-interval", "0.2")
    with BrokerClient(server.url) as client:  # no producer registered: only the checker can answer
        client.send_half(Message("orders", b"checked"), producer_group="pg", transaction_id="t-c")
        deadline = time.monotonic() + 30
        while client.transaction_state("t-c") is not TransactionState.COMMITTED:
            assert time.monotonic() < deadline, "the plugged-in checker never answered"
            time.sleep(0.05)
        assert [r.message.body for r in client.receive("g", "orders", wait_s=5)] == [b"checked"]
