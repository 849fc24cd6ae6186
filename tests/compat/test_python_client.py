"""The official RocketMQ 5 Python client (rocketmq-python-client 5.1.2) against a real
``halfmoon-broker serve --grpc-port`` process: producing (normal, FIFO, delay,
transactional), check-backs over Telemetry, and the SimpleConsumer. The broker's own state
is read back over its native protocol."""

from __future__ import annotations

import functools
import gzip
import hashlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker_embedded.message import TransactionState
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc._proto import service_pb2 as spb
from broker_embedded.server.grpc.convert import deliver_at_ms, from_proto, to_proto
from broker_embedded.server.grpc.signature import DATE_HEADER, sign
from tests.ports import free_port

from .conftest import GrpcBroker, eventually, rocketmq, start_grpc_broker

Resolution = rocketmq.TransactionResolution


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _message(topic: str, body: bytes, **fields: Any) -> Any:
    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    for name, value in fields.items():
        setattr(message, name, value)
    return message


class BodyChecker(rocketmq.TransactionChecker):  # type: ignore[misc,name-defined]
    """Answers a check-back from the half message's body (b"commit", b"rollback", else raises)."""

    def __init__(self) -> None:
        self.checked: list[bytes] = []
        self.lock = threading.Lock()

    def check(self, message: Any) -> Any:
        with self.lock:
            self.checked.append(message.body)
        if message.body.startswith(b"commit"):
            return Resolution.COMMIT
        if message.body.startswith(b"rollback"):
            return Resolution.ROLLBACK
        raise RuntimeError("the local transaction's outcome cannot be read")


class NeverSure(rocketmq.TransactionChecker):  # type: ignore[misc,name-defined]
    """A checker that cannot tell (raises: the broker hears nothing, i.e. UNKNOWN)."""

    def check(self, message: Any) -> Any:
        raise RuntimeError("not this process's transaction")


def _call(endpoint: str, rpc: str, request: Any, answer: Any, metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    """One unary RPC of MessagingService over a plain gRPC channel (no client library)."""
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/apache.rocketmq.v2.MessagingService/{rpc}",
                                   request_serializer=type(request).SerializeToString,
                                   response_deserializer=answer.FromString)
        return call(request, metadata=metadata, timeout=30)


def _consumer(broker: GrpcBroker, clients: Callable[[Any], Any], topic: str, await_s: int = 1) -> Any:
    return clients(rocketmq.SimpleConsumer(broker.config(), _name("group"), {topic: rocketmq.FilterExpression()},
                                           await_duration=await_s))


def _receive_all(consumer: Any, count: int, invisible_s: int = 20) -> list[Any]:
    """Receive and ack until ``count`` messages came (bounded)."""
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.receive(32, invisible_s):
            consumer.ack(message)
            got.append(message)
    return got


def test_send_receive_ack(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("orders")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    sent = []
    for n in range(3):
        message = _message(topic, f"order {n}".encode(), tag="created", keys=f"order-{n}")
        message.add_property("source", "test")
        sent.append(producer.send(message).message_id)
    consumer = _consumer(grpc_broker, clients, topic)
    got = _receive_all(consumer, 3)
    assert sorted(m.body for m in got) == [b"order 0", b"order 1", b"order 2"]
    assert sorted(m.message_id for m in got) == sorted(sent)
    assert {m.tag for m in got} == {"created"}
    assert {tuple(m.keys) for m in got} == {("order-0",), ("order-1",), ("order-2",)}
    assert all(m.properties["source"] == "test" and m.delivery_attempt == 1 for m in got)
    assert not any(m.corrupted for m in got)  # the client checked each body's digest
    assert consumer.receive(32, 20) == []  # acked: MESSAGE_NOT_FOUND after the long poll


def test_concurrent_sends(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """Sends in flight together (they share the broker's write batches) each get their own receipt."""
    topic = _name("burst")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    futures = [producer.send_async(_message(topic, f"burst {n}".encode())) for n in range(20)]
    receipts = [future.result(timeout=30) for future in futures]
    assert len({receipt.message_id for receipt in receipts}) == 20
    consumer = _consumer(grpc_broker, clients, topic)
    assert sorted(m.body for m in _receive_all(consumer, 20)) == sorted(f"burst {n}".encode() for n in range(20))


def test_commit_is_visible_and_rollback_never(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("tx")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,), BodyChecker()))
    ids = {}
    for body in (b"committed", b"rolled back"):
        transaction = producer.begin_transaction()
        receipt = producer.send(_message(topic, body), transaction)
        assert receipt.transaction_id == receipt.message_id  # the transaction id is the message id
        (transaction.commit if body == b"committed" else transaction.rollback)()
        ids[body] = receipt.transaction_id
    consumer = _consumer(grpc_broker, clients, topic)
    assert [m.body for m in _receive_all(consumer, 1)] == [b"committed"]
    assert consumer.receive(32, 20) == []
    with grpc_broker.native() as native:
        assert native.transaction_state(ids[b"committed"]) is TransactionState.COMMITTED
        assert native.transaction_state(ids[b"rolled back"]) is TransactionState.ROLLED_BACK


def test_check_back_commit_and_rollback(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """Half messages left without END are checked over the sender's Telemetry stream; the
    checker's answer (EndTransaction from SOURCE_SERVER_CHECK) resolves them."""
    topic = _name("checked")
    checker = BodyChecker()
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,), checker))
    ids = {}
    for body in (b"commit me", b"rollback me"):
        ids[body] = producer.send(_message(topic, body), producer.begin_transaction()).transaction_id
    with grpc_broker.native() as native:
        def state(body: bytes) -> TransactionState:
            return native.transaction_state(ids[body])

        assert eventually(lambda: state(b"commit me") is TransactionState.COMMITTED)
        assert eventually(lambda: state(b"rollback me") is TransactionState.ROLLED_BACK)
    assert sorted(set(checker.checked)) == [b"commit me", b"rollback me"]
    consumer = _consumer(grpc_broker, clients, topic)
    assert [m.body for m in _receive_all(consumer, 1)] == [b"commit me"]


def test_raising_checker_is_unknown_checked_again_then_parked(grpc_broker: GrpcBroker,
                                                               clients: Callable[[Any], Any]) -> None:
    topic = _name("unknown")
    checker = BodyChecker()
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,), checker))
    transaction_id = producer.send(_message(topic, b"cannot tell"), producer.begin_transaction()).transaction_id
    with grpc_broker.native() as native:
        assert eventually(lambda: native.transaction_state(transaction_id) is TransactionState.PARKED, 30)
        assert transaction_id in [p.transaction_id for p in native.list_parked()]
    assert eventually(lambda: len(checker.checked) == 3)  # --check-max 3: asked three times, then parked


def test_check_back_goes_to_another_producer_of_the_topic(grpc_broker: GrpcBroker,
                                                          clients: Callable[[Any], Any]) -> None:
    """The sender is gone: the check goes to a live client publishing the topic."""
    topic = _name("handover")
    sender = rocketmq.Producer(grpc_broker.config(), (topic,), NeverSure())
    sender.startup()
    transaction_id = sender.send(_message(topic, b"commit later"), sender.begin_transaction()).transaction_id
    sender.shutdown()
    checker = BodyChecker()
    clients(rocketmq.Producer(grpc_broker.config(), (topic,), checker))
    with grpc_broker.native() as native:
        assert eventually(lambda: native.transaction_state(transaction_id) is TransactionState.COMMITTED)
    assert checker.checked and set(checker.checked) == {b"commit later"}


def test_repeated_and_conflicting_end(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("ends")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,), BodyChecker()))
    transaction = producer.begin_transaction()
    receipt = producer.send(_message(topic, b"commit once"), transaction)
    assert transaction.commit().status.code == pb.OK
    assert transaction.commit().status.code == pb.OK  # a repeat of the recorded resolution
    with pytest.raises(rocketmq.v5.exception.ClientException) as conflict:
        transaction.rollback()
    assert conflict.value.code == pb.PRECONDITION_FAILED
    stranger = _message(topic, b"x", message_id="no-such-transaction")
    unknown = producer.end_transaction(receipt.message_queue.endpoints, stranger, stranger.message_id,
                                       Resolution.COMMIT, pb.SOURCE_CLIENT)
    assert unknown.status.code == pb.INVALID_TRANSACTION_ID


def test_commit_after_a_broker_restart(tmp_path: Path, clients: Callable[[Any], Any]) -> None:
    """The transaction is the broker's (durable), not a proxy's memory: END after a restart commits."""
    slow_checks = ("--transaction-timeout", "60")  # no check-back meanwhile
    broker = start_grpc_broker(tmp_path / "broker", *slow_checks)
    try:
        topic = _name("restart")
        producer = clients(rocketmq.Producer(broker.config(), (topic,), NeverSure()))
        transaction = producer.begin_transaction()
        producer.send(_message(topic, b"survives"), transaction)
        broker.process.stop()
        broker = start_grpc_broker(tmp_path / "broker", *slow_checks, grpc_port=broker.grpc_port)
        eventually(lambda: _commits(transaction))
        consumer = _consumer(broker, clients, topic)
        assert [m.body for m in _receive_all(consumer, 1)] == [b"survives"]
    finally:
        broker.process.stop()


def _commits(transaction: Any) -> bool:
    """Commit; False while the client's channel reconnects."""
    try:
        return bool(transaction.commit().status.code == pb.OK)
    except Exception as exc:
        if "UNAVAILABLE" in str(exc):
            return False
        raise


def test_too_large_a_body(grpc_broker: GrpcBroker) -> None:
    """Over the broker's max_body_size (4 MiB): MESSAGE_BODY_TOO_LARGE, nothing stored."""
    message = pb.Message(topic=pb.Resource(name=_name("big")), body=b"x" * (4 * 1024 * 1024 + 1),
                         system_properties=pb.SystemProperties(message_id="big-1", message_type=pb.NORMAL))
    answer = _call(grpc_broker.endpoint, "SendMessage", spb.SendMessageRequest(messages=[message]),
                   spb.SendMessageResponse)
    assert answer.status.code == answer.entries[0].status.code == pb.MESSAGE_BODY_TOO_LARGE
    with grpc_broker.native() as native:
        assert native.query_by_id("big-1") is None


def test_fifo_one_in_flight_per_group_in_order(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("fifo")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for n in range(4):
        producer.send(_message(topic, f"step {n}".encode(), message_group="account-1"))
    consumer = _consumer(grpc_broker, clients, topic)
    order = []
    for _ in range(4):
        batch = eventually(lambda: consumer.receive(32, 20))
        assert len(batch) == 1  # the next of the group waits for this one's ack
        assert batch[0].message_group == "account-1"
        order.append(batch[0].body)
        consumer.ack(batch[0])
    assert order == [b"step 0", b"step 1", b"step 2", b"step 3"]


def test_delay(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("delayed")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    due_ms = int(time.time() * 1000) + 2000
    producer.send(_message(topic, b"later", delivery_timestamp=due_ms))  # 5.1.2: milliseconds
    consumer = _consumer(grpc_broker, clients, topic)
    got = _receive_all(consumer, 1)
    assert [m.body for m in got] == [b"later"]
    assert time.time() * 1000 >= due_ms  # not delivered before its time


def test_delivery_timestamp_in_seconds_or_milliseconds() -> None:
    """The protocol's seconds and the Python client 5.1.2's milliseconds-in-seconds agree."""
    in_seconds, in_milliseconds = pb.SystemProperties(), pb.SystemProperties()
    in_seconds.delivery_timestamp.seconds, in_seconds.delivery_timestamp.nanos = 1_900_000_000, 250_000_000
    in_milliseconds.delivery_timestamp.seconds = 1_900_000_000_250
    assert deliver_at_ms(in_seconds) == deliver_at_ms(in_milliseconds) == 1_900_000_000_250
    assert deliver_at_ms(pb.SystemProperties()) is None


def test_a_sent_message_converts_field_by_field() -> None:
    properties = pb.SystemProperties(message_id="m-1", tag="paid", keys=["order-7"], message_group="account-1",
                                     message_type=pb.FIFO, body_encoding=pb.GZIP)
    properties.orphaned_transaction_recovery_duration.FromSeconds(30)
    sent = pb.Message(topic=pb.Resource(name="orders"), user_properties={"source": "shop"},
                      system_properties=properties, body=gzip.compress(b"order paid"))
    message = from_proto(sent)
    assert (message.topic, message.body, message.message_id, message.tag, message.keys, message.message_group,
            dict(message.properties), message.transaction_timeout_s) == (
        "orders", b"order paid", "m-1", "paid", ("order-7",), "account-1", {"source": "shop"}, 30.0)
    back = to_proto(message).system_properties
    assert back.body_digest == pb.Digest(type=pb.MD5, checksum=hashlib.md5(b"order paid").hexdigest().upper())
    assert back.body_encoding == pb.IDENTITY
    assert back.message_type == pb.FIFO and back.message_group == "account-1"


def test_change_invisible_duration(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("invisible")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    producer.send(_message(topic, b"slow work"))
    consumer = _consumer(grpc_broker, clients, topic)
    [message] = eventually(lambda: consumer.receive(1, 30))
    first_handle = message.receipt_handle
    consumer.change_invisible_duration(message, 1)  # the client keeps the new handle
    assert message.receipt_handle != first_handle
    [again] = eventually(lambda: consumer.receive(1, 30))  # invisible for 1 s only: back again
    assert again.body == b"slow work" and again.delivery_attempt == 2
    consumer.ack(again)
    assert consumer.receive(1, 30) == []


def test_route_names_the_advertised_address(grpc_broker: GrpcBroker) -> None:
    asked_via = pb.Endpoints(scheme=pb.DOMAIN_NAME, addresses=[pb.Address(host="lb.example.com", port=80)])
    route = _call(grpc_broker.endpoint, "QueryRoute",
                  spb.QueryRouteRequest(topic=pb.Resource(name=_name("routed")), endpoints=asked_via),
                  spb.QueryRouteResponse)
    assert route.status.code == pb.OK
    assert [queue.id for queue in route.message_queues] == [0, 1, 2, 3]  # the broker's default_queues
    for queue in route.message_queues:
        assert queue.permission == pb.READ_WRITE and queue.broker.id == 0
        assert set(queue.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION, pb.PRIORITY, pb.LITE}
        assert queue.broker.endpoints == pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=grpc_broker.grpc_port)])


def test_assignment_is_every_broker_of_the_route(grpc_broker: GrpcBroker) -> None:
    """A push consumer is assigned each broker as queue -1 (all its queues), as RocketMQ's proxy
    assigns a non-FIFO group."""
    topic = pb.Resource(name=_name("assigned"))
    answer = _call(grpc_broker.endpoint, "QueryAssignment",
                   spb.QueryAssignmentRequest(topic=topic, group=pb.Resource(name=_name("group"))),
                   spb.QueryAssignmentResponse)
    assert answer.status.code == pb.OK
    [assignment] = answer.assignments
    queue = assignment.message_queue
    assert (queue.topic, queue.id, queue.permission) == (topic, -1, pb.READ_WRITE)
    assert queue.broker.endpoints == pb.Endpoints(
        scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=grpc_broker.grpc_port)])


def test_unimplemented_rpcs_say_so(grpc_broker: GrpcBroker) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _call(grpc_broker.endpoint, "GetOffset", spb.GetOffsetRequest(), spb.GetOffsetResponse)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "GetOffset is not implemented" in refused.value.details()


@pytest.fixture
def signed_broker(tmp_path: Path) -> Iterator[GrpcBroker]:
    broker = start_grpc_broker(tmp_path / "broker", "--access-key", "app", "--secret-key", "s3cret")
    yield broker
    broker.process.stop()


def _query_route(endpoint: str, metadata: tuple[tuple[str, str], ...]) -> spb.QueryRouteResponse:
    return _call(endpoint, "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="signed")),
                 spb.QueryRouteResponse, metadata)


def test_signed_calls_with_the_brokers_keys(signed_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic = _name("signed")
    producer = clients(rocketmq.Producer(signed_broker.config("app", "s3cret"), (topic,)))
    assert producer.send(_message(topic, b"signed")).message_id
    intruder = clients(rocketmq.Producer(signed_broker.config("app", "wrong"), ()))
    with pytest.raises(Exception, match="route"):  # the client reports the refused QueryRoute so
        intruder.send(_message(topic, b"unsigned"))
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    wrong = f"MQv2-HMAC-SHA1 Credential=app, SignedHeaders=x-mq-date-time, Signature={sign('wrong', date)}"
    for metadata, reason in ((((DATE_HEADER, date), ("authorization", wrong)), "signature is wrong"),
                             ((), "not signed")):
        with pytest.raises(grpc.RpcError) as refused:
            _query_route(signed_broker.endpoint, metadata)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert reason in refused.value.details()
    right = wrong.replace(sign("wrong", date), sign("s3cret", date))
    assert _query_route(signed_broker.endpoint, ((DATE_HEADER, date), ("authorization", right))).status.code == pb.OK


def _holder(brokers: list[GrpcBroker], transaction_id: str) -> int:
    """The index of the broker that stores ``transaction_id``."""
    for n, broker in enumerate(brokers):
        with broker.native() as native:
            if transaction_id in native.open_transactions():
                return n
    raise AssertionError(f"no broker holds transaction {transaction_id}")


def _committed(broker: GrpcBroker, transaction_id: str) -> bool:
    with broker.native() as native:
        return native.transaction_state(transaction_id) is TransactionState.COMMITTED


def test_several_brokers_in_one_route(two_brokers: list[GrpcBroker], clients: Callable[[Any], Any]) -> None:
    """The client spreads sends over both brokers and answers each one's check-backs."""
    first, _ = two_brokers
    topic = _name("spread")
    checker = BodyChecker()
    producer = clients(rocketmq.Producer(first.config(), (topic,), checker))
    held: dict[int, str] = {}
    sent = 0
    while len(held) < 2 and sent < 16:  # the client takes the route's queues in turn
        receipt = producer.send(_message(topic, f"commit {sent}".encode()), producer.begin_transaction())
        held.setdefault(_holder(two_brokers, receipt.transaction_id), receipt.transaction_id)
        sent += 1
    assert sorted(held) == [0, 1]
    for n, transaction_id in held.items():  # no END was sent: each broker's check-back committed it
        assert eventually(functools.partial(_committed, two_brokers[n], transaction_id))
    consumer = _consumer(first, clients, topic)  # receives from both brokers of the route
    assert len(_receive_all(consumer, sent)) == sent


REFUSED_OPTIONS = [
    (("--grpc-port", "0", "--grpc-advertise", "no-port"), "ValueError: an advertised gRPC address must be host:port"),
    (("--grpc-advertise", "127.0.0.1:8081"), "ValueError: --grpc-host, --grpc-advertise, --grpc-tls-* and"),
    (("--grpc-port", "{taken}"), "OSError: cannot listen for gRPC on 127.0.0.1:"),
    (("--grpc-port", "0", "--grpc-tls-cert", "cert.pem"), "ValueError: --grpc-tls-cert and --grpc-tls-key go"),
    (("--grpc-port", "0", "--grpc-client-utc-offsets", "+25:00"), "ValueError: UTC offset +25:00 is beyond"),
]


@pytest.mark.parametrize(("options", "error"), REFUSED_OPTIONS,
                         ids=["bad advertise", "no port", "port in use", "TLS cert alone", "no such zone"])
def test_serve_refuses_grpc_options_it_cannot_serve(tmp_path: Path, options: tuple[str, ...], error: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        argv = [option.format(taken=taken.getsockname()[1]) for option in options]
        result = subprocess.run([sys.executable, "-m", "broker_embedded", "serve", "--data-dir",
                                 str(tmp_path / "broker"), "--port", str(free_port()), *argv],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {error}")


def test_simple_consumer_with_a_tag_filter(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """The client's ``FilterExpression("tag")`` and ``"a || b"``: a group gets the messages
    with its tags; the others are consumed for it (another group still gets them)."""
    topic = _name("orders")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for n, tag in enumerate(("paid", "created", "paid", "shipped")):
        producer.send(_message(topic, f"{tag} {n}".encode(), tag=tag))
    subscribed = {"paid": [b"paid 0", b"paid 2"], "created || shipped": [b"created 1", b"shipped 3"]}
    for expression, expected in subscribed.items():
        consumer = clients(rocketmq.SimpleConsumer(grpc_broker.config(), _name("group"),
                                                   {topic: rocketmq.FilterExpression(expression)}, await_duration=1))
        got = _receive_all(consumer, len(expected))
        assert sorted(m.body for m in got) == expected
        assert not any(m.corrupted for m in got)
        assert consumer.receive(32, 20) == []
    everything = _receive_all(_consumer(grpc_broker, clients, topic), 4)
    assert len(everything) == 4


def test_simple_consumer_with_an_sql92_filter(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """The client's ``FilterExpression("...", FilterType.SQL)``: a group gets the messages
    whose properties match; the others are consumed for it."""
    from rocketmq.grpc_protocol import FilterType

    topic = _name("orders")
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for n, (amount, region) in enumerate([(3, "eu"), (12, "eu"), (40, "us"), (7, "")]):
        message = _message(topic, f"{amount} {region}".encode(), tag="paid" if n % 2 else "created")
        message.add_property("amount", str(amount))
        if region:
            message.add_property("region", region)
        producer.send(message)
    expression = rocketmq.FilterExpression("amount > 5 AND (region = 'eu' OR region IS NULL) AND TAGS = 'paid'",
                                           FilterType.SQL)
    consumer = clients(rocketmq.SimpleConsumer(grpc_broker.config(), _name("group"), {topic: expression},
                                               await_duration=1))
    got = _receive_all(consumer, 2)
    assert sorted(m.body for m in got) == [b"12 eu", b"7 "]
    assert consumer.receive(32, 20) == []


def test_malformed_filters_are_refused(grpc_broker: GrpcBroker) -> None:
    """ILLEGAL_FILTER_EXPRESSION with the reason, before anything is received."""
    topic = _name("orders")
    for expression, kind, reason in (("amount >", pb.SQL, "found the end at position 8"),
                                     ("amount > 'x'", pb.SQL, "numbers only"),
                                     ("paid ||", pb.TAG, "not a TAG expression")):
        request = spb.ReceiveMessageRequest(
            group=pb.Resource(name=_name("group")), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
            filter_expression=pb.FilterExpression(type=kind, expression=expression), batch_size=1)
        with grpc.insecure_channel(grpc_broker.endpoint) as channel:
            call = channel.unary_stream("/apache.rocketmq.v2.MessagingService/ReceiveMessage",
                                        request_serializer=spb.ReceiveMessageRequest.SerializeToString,
                                        response_deserializer=spb.ReceiveMessageResponse.FromString)
            answers = list(call(request, timeout=30))
        assert [a.status.code for a in answers] == [pb.ILLEGAL_FILTER_EXPRESSION]
        assert reason in answers[0].status.message
