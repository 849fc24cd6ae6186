"""The official RocketMQ 5 Python client's PushConsumer (rocketmq-python-client 5.1.2), as its
``push_consumer_example.py`` uses it (a MessageListener, a group, ``{topic: FilterExpression()}``),
against the broker's gRPC port: every message delivered once, a failed message redelivered
after the back-off of the settings and dead-lettered after the broker's attempts, and a message
group consumed in order. Retries and the DLQ need a broker with a short retry schedule, which
``serve`` has no option for: those tests serve gRPC from an in-process broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from broker_embedded import Message
from broker_embedded.broker.config import BrokerConfig
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc._proto import service_pb2 as spb
from broker_embedded.server.grpc.service import SERVICE_NAME

from .conftest import (
    GrpcBroker,
    InProcess,
    eventually,
    in_process_grpc,
    rocketmq,
    start_grpc_broker,
    wait_for_port,
)

#: Attempts and back-off of the in-process broker: a failing message is delivered three times,
#: one second apart (the Python client reads whole seconds), then dead-lettered.
ATTEMPTS = 3
BACKOFF_S = 1.0
SERVICE = f"/{SERVICE_NAME}"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Delivery:
    body: str
    attempt: int
    message_group: str | None
    at: float
    corrupted: bool


@dataclass
class RecordingListener(rocketmq.MessageListener):  # type: ignore[misc,name-defined]
    """Records each delivery; fails the messages whose body starts with ``fail_prefix`` on
    their first ``fail_times`` attempts; works ``work_s`` on each message before answering."""

    fail_prefix: str = "fail"
    fail_times: int = 0
    work_s: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def consume(self, message: Any) -> Any:
        body = message.body.decode()
        with self.lock:
            self.deliveries.append(Delivery(body, message.delivery_attempt, message.message_group or None,
                                            time.monotonic(), message.corrupted))
        time.sleep(self.work_s)
        if body.startswith(self.fail_prefix) and message.delivery_attempt <= self.fail_times:
            return rocketmq.ConsumeResult.FAILURE
        return rocketmq.ConsumeResult.SUCCESS

    def bodies(self) -> list[str]:
        with self.lock:
            return [delivery.body for delivery in self.deliveries]

    def of(self, body: str) -> list[Delivery]:
        with self.lock:
            return [delivery for delivery in self.deliveries if delivery.body == body]


def _message(topic: str, body: str, **fields: Any) -> Any:
    message = rocketmq.Message()
    message.topic = topic
    message.body = body.encode()
    for name, value in fields.items():
        setattr(message, name, value)
    return message


def _push_consumer(config: Any, group: str, topic: str, listener: RecordingListener) -> Any:
    return rocketmq.PushConsumer(config, group, listener, {topic: rocketmq.FilterExpression()})


def test_every_message_once(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    topic, group = _name("orders"), _name("group")
    listener = RecordingListener()
    clients(_push_consumer(grpc_broker.config(), group, topic, listener))
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    bodies = [f"order {n}" for n in range(20)]
    for body in bodies:
        producer.send(_message(topic, body, tag="created"))
    assert eventually(lambda: sorted(listener.bodies()) == sorted(bodies))
    assert not any(delivery.corrupted for delivery in listener.deliveries)
    with grpc_broker.native() as native:  # each acked: nothing left for the group
        assert eventually(lambda: sum(native.stats().consumer_lag.get(group, {}).values()) == 0)
    assert sorted(listener.bodies()) == sorted(bodies)  # and none came twice


def test_a_tag_filter(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """``{topic: FilterExpression("paid || refunded")}``: the listener gets those tags only;
    the others are consumed for the group (its lag drains to 0)."""
    topic, group = _name("orders"), _name("group")
    listener = RecordingListener()
    clients(rocketmq.PushConsumer(grpc_broker.config(), group, listener,
                                  {topic: rocketmq.FilterExpression("paid || refunded")}))
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for n, tag in enumerate(("paid", "created", "refunded", "created", "paid")):
        producer.send(_message(topic, f"{tag} {n}", tag=tag))
    assert eventually(lambda: sorted(listener.bodies()) == ["paid 0", "paid 4", "refunded 2"])
    with grpc_broker.native() as native:
        assert eventually(lambda: sum(native.stats().consumer_lag.get(group, {}).values()) == 0)
    assert sorted(listener.bodies()) == ["paid 0", "paid 4", "refunded 2"]


def test_an_sql92_filter(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """``FilterExpression("amount >= 10", FilterType.SQL)``: the listener gets the messages
    whose property matches; the others are consumed for the group."""
    from rocketmq.grpc_protocol import FilterType

    topic, group = _name("orders"), _name("group")
    listener = RecordingListener()
    clients(rocketmq.PushConsumer(grpc_broker.config(), group, listener,
                                  {topic: rocketmq.FilterExpression("amount >= 10", FilterType.SQL)}))
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for amount in (5, 10, 20, 1):
        message = _message(topic, f"amount {amount}")
        message.add_property("amount", str(amount))
        producer.send(message)
    assert eventually(lambda: sorted(listener.bodies()) == ["amount 10", "amount 20"])
    with grpc_broker.native() as native:
        assert eventually(lambda: sum(native.stats().consumer_lag.get(group, {}).values()) == 0)
    assert sorted(listener.bodies()) == ["amount 10", "amount 20"]


def test_every_broker_of_a_static_route(two_brokers: list[GrpcBroker], clients: Callable[[Any], Any]) -> None:
    """Two brokers behind one static route: the consumer is assigned both and gets the
    messages the producer spread over them."""
    topic = _name("spread")
    producer = clients(rocketmq.Producer(two_brokers[0].config(), (topic,)))
    bodies = [f"order {n}" for n in range(12)]
    for body in bodies:
        producer.send(_message(topic, body))
    for broker in two_brokers:  # the producer took the route's queues in turn: both hold some
        with broker.native() as native:
            assert sum(sum(info.depth) for info in native.list_topics() if info.name == topic) > 0
    listener = RecordingListener()
    clients(_push_consumer(two_brokers[0].config(), _name("group"), topic, listener))
    assert eventually(lambda: sorted(listener.bodies()) == sorted(bodies))


def test_a_message_group_in_order(grpc_broker: GrpcBroker, clients: Callable[[Any], Any]) -> None:
    """Messages of one group come one at a time, in order, a failed one redelivered before the
    next; two groups interleave freely."""
    topic = _name("fifo")
    listener = RecordingListener(fail_prefix="a 2", fail_times=1)
    producer = clients(rocketmq.Producer(grpc_broker.config(), (topic,)))
    for n in range(5):
        for account in ("a", "b"):
            producer.send(_message(topic, f"{account} {n}", message_group=f"account-{account}"))
    clients(_push_consumer(grpc_broker.config(), _name("group"), topic, listener))
    assert eventually(lambda: len(listener.bodies()) == 11, 60)  # "a 2" twice
    for account in ("a", "b"):
        deliveries = [d for d in listener.deliveries if d.message_group == f"account-{account}"]
        expected = [f"{account} {n}" for n in range(5)]
        if account == "a":
            expected.insert(3, "a 2")
        assert [d.body for d in deliveries] == expected
    first, again = listener.of("a 2")
    assert (first.attempt, again.attempt) == (1, 2)


def test_failure_is_redelivered_after_the_back_off_then_dead_lettered(
        in_process: Callable[..., InProcess], clients: Callable[[Any], Any]) -> None:
    served = in_process(BrokerConfig(max_delivery_attempts=ATTEMPTS, retry_backoff_s=(BACKOFF_S,)))
    broker, config = served.broker, served.config
    topic, group = _name("retried"), _name("group")
    listener = RecordingListener(fail_prefix="fail", fail_times=ATTEMPTS)
    clients(_push_consumer(config, group, topic, listener))
    producer = clients(rocketmq.Producer(config, (topic,)))
    failing = producer.send(_message(topic, "fail always")).message_id
    producer.send(_message(topic, "fine"))
    assert eventually(lambda: [m.message.message_id for m in broker.list_dlq(group)] == [failing], 60)
    deliveries = listener.of("fail always")
    assert [d.attempt for d in deliveries] == list(range(1, ATTEMPTS + 1))
    gaps = [later.at - earlier.at for earlier, later in zip(deliveries, deliveries[1:], strict=False)]
    assert all(gap >= BACKOFF_S * 0.9 for gap in gaps), gaps  # not before the back-off of the settings
    assert [d.attempt for d in listener.of("fine")] == [1]


def test_a_slow_listener_keeps_its_message(in_process: Callable[..., InProcess],
                                           clients: Callable[[Any], Any]) -> None:
    """A message a push consumer holds stays invisible past its invisible duration (renewed,
    RocketMQ's auto_renew): a listener working 4 s on it, with 1.5 s of invisibility, gets it
    once and its ack is taken."""
    served = in_process(BrokerConfig(retry_backoff_s=(0.5,)), push_invisible_s=1.5)
    broker, config = served.broker, served.config
    topic, group = _name("slow"), _name("group")
    listener = RecordingListener(work_s=4.0)
    clients(_push_consumer(config, group, topic, listener))
    producer = clients(rocketmq.Producer(config, (topic,)))
    producer.send(_message(topic, "slow work"))
    assert eventually(lambda: sum(broker.stats().consumer_lag.get(group, {}).values()) == 0
                      and listener.bodies() == ["slow work"])
    time.sleep(2.0)  # unrenewed, it would be back by now
    assert [(d.body, d.attempt) for d in listener.deliveries] == [("slow work", 1)]


def _receive(endpoint: str, group: str, topic: str, client_id: str, auto_renew: bool,
             wait_s: int = 0) -> list[Any]:
    """One ReceiveMessage over a plain gRPC channel, as client ``client_id``: the messages."""
    request = spb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=32, auto_renew=auto_renew,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
    request.long_polling_timeout.FromSeconds(wait_s)
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_stream(f"{SERVICE}/ReceiveMessage", request_serializer=spb.ReceiveMessageRequest.SerializeToString,
                                    response_deserializer=spb.ReceiveMessageResponse.FromString)
        return [answer.message for answer in call(request, metadata=(("x-mq-client-id", client_id),), timeout=30)
                if answer.HasField("message")]


def _unary(endpoint: str, method: str, request: Any, response_type: Any, client_id: str) -> Any:
    """One unary call of the service over a plain gRPC channel, as client ``client_id``."""
    with grpc.insecure_channel(endpoint) as channel:
        return channel.unary_unary(f"{SERVICE}/{method}", request_serializer=type(request).SerializeToString,
                                   response_deserializer=response_type.FromString)(
            request, metadata=(("x-mq-client-id", client_id),), timeout=30)


def test_held_messages_come_back_when_their_client_ends(in_process: Callable[..., InProcess]) -> None:
    """Received with auto_renew, a message stays invisible past its invisible duration until its
    client says it ends (NotifyClientTermination): then it comes back."""
    served = in_process(BrokerConfig(retry_backoff_s=(0.5,)), push_invisible_s=1.0)
    topic, group = _name("held"), _name("group")
    served.broker.send(Message(topic=topic, body=b"held"))
    [held] = _receive(served.endpoint, group, topic, "client-1", auto_renew=True, wait_s=5)
    time.sleep(3.0)  # three invisible durations
    assert _receive(served.endpoint, group, topic, "client-2", auto_renew=False) == []
    _unary(served.endpoint, "NotifyClientTermination", spb.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
           spb.NotifyClientTerminationResponse, "client-1")
    [again] = _receive(served.endpoint, group, topic, "client-2", auto_renew=False, wait_s=10)
    assert again.system_properties.message_id == held.system_properties.message_id
    assert again.system_properties.delivery_attempt == 2


def _telemetry(endpoint: str, client_id: str, quiet: threading.Event | None = None) -> threading.Thread:
    """A Telemetry stream of client ``client_id``, open until the server ends it or ``quiet``
    is set (a thread reading it; join it after)."""
    ended = quiet or threading.Event()

    def run() -> None:
        with grpc.insecure_channel(endpoint) as channel:
            call = channel.stream_stream(f"{SERVICE}/Telemetry", request_serializer=spb.TelemetryCommand.SerializeToString,
                                         response_deserializer=spb.TelemetryCommand.FromString)
            commands = call(iter(ended.wait, True), metadata=(("x-mq-client-id", client_id),))  # sends nothing
            try:
                for _ in commands:
                    pass
            except grpc.RpcError:
                pass  # the server went away
            finally:
                ended.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _ack(endpoint: str, group: str, message: Any, client_id: str) -> int:
    """AckMessage of ``message`` with the receipt handle it was received with: the status code."""
    entry = spb.AckMessageEntry(message_id=message.system_properties.message_id,
                                receipt_handle=message.system_properties.receipt_handle)
    answer = _unary(endpoint, "AckMessage", spb.AckMessageRequest(group=pb.Resource(name=group), entries=[entry]),
                    spb.AckMessageResponse, client_id)
    return int(answer.status.code)


def test_a_held_message_comes_back_within_a_second_when_its_client_ends(
        in_process: Callable[..., InProcess]) -> None:
    """A client that ends (NotifyClientTermination; a closed Telemetry stream and no sign of
    life for 30 s do the same) has its held messages released, as RocketMQ's proxy clears a
    client gone offline: another consumer gets one within about a second, not once its 30 s of
    invisibility are over."""
    served = in_process(BrokerConfig(retry_backoff_s=(0.5,)), push_invisible_s=30.0)
    topic, group = _name("released"), _name("group")
    served.broker.send(Message(topic=topic, body=b"released"))
    [held] = _receive(served.endpoint, group, topic, "client-1", auto_renew=True, wait_s=5)
    _unary(served.endpoint, "NotifyClientTermination", spb.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
           spb.NotifyClientTerminationResponse, "client-1")
    [again] = _receive(served.endpoint, group, topic, "client-2", auto_renew=False, wait_s=10)
    assert again.system_properties.message_id == held.system_properties.message_id
    assert again.system_properties.delivery_attempt == 2


def test_a_held_message_stays_held_when_the_telemetry_stream_of_a_live_client_closes(
        in_process: Callable[..., InProcess]) -> None:
    """A proxy or load balancer resetting a consumer's Telemetry stream does not end the
    client (it opens another at its next settings sync, and heartbeats meanwhile): the
    messages it holds stay invisible to the others instead of coming back within a second
    while its listener works on them; its NotifyClientTermination still releases them."""
    served = in_process(BrokerConfig(retry_backoff_s=(0.5,)), push_invisible_s=30.0)
    topic, group = _name("held"), _name("group")
    served.broker.send(Message(topic=topic, body=b"held"))
    [held] = _receive(served.endpoint, group, topic, "client-1", auto_renew=True, wait_s=5)
    reset = threading.Event()
    telemetry = _telemetry(served.endpoint, "client-1", reset)
    time.sleep(0.5)  # the stream is open
    reset.set()
    telemetry.join(timeout=10)
    assert not telemetry.is_alive()
    _unary(served.endpoint, "Heartbeat", spb.HeartbeatRequest(group=pb.Resource(name=group)),
           spb.HeartbeatResponse, "client-1")
    assert _receive(served.endpoint, group, topic, "client-2", auto_renew=False, wait_s=3) == []
    _unary(served.endpoint, "NotifyClientTermination", spb.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
           spb.NotifyClientTerminationResponse, "client-1")
    [again] = _receive(served.endpoint, group, topic, "client-2", auto_renew=False, wait_s=10)
    assert again.system_properties.message_id == held.system_properties.message_id


#: Push invisibility of the test below: renewed 4 s after a receive (a third before its end),
#: so 4.5 s after one the message was renewed once and stays invisible for ~5.5 s more.
RENEWED_INVISIBLE_S = 6.0
AFTER_A_RENEWAL_S = 4.5


def test_a_held_message_is_acked_with_its_first_handle_after_the_broker_restarted(tmp_path: Path) -> None:
    """Across a restart of the broker (and its gRPC front, whose renewals are in memory): the
    renewal's invisible time and the client's first handle survive (the front renews in place
    and its stop releases nothing), so the ack is taken and the message is not delivered
    again. A renewal that issued a new handle left the client's refused
    (INVALID_RECEIPT_HANDLE) and the message came back."""
    topic, group = _name("restart"), _name("group")
    config = BrokerConfig(retry_backoff_s=(0.5,))
    with in_process_grpc(tmp_path / "broker", config, push_invisible_s=RENEWED_INVISIBLE_S) as (broker, endpoint):
        telemetry = _telemetry(endpoint, "client-1")  # the stop ends it, as a client's own end would
        broker.send(Message(topic=topic, body=b"held across a restart"))
        [held] = _receive(endpoint, group, topic, "client-1", auto_renew=True, wait_s=5)
        time.sleep(AFTER_A_RENEWAL_S)
    telemetry.join(30)
    with in_process_grpc(tmp_path / "broker", config, push_invisible_s=RENEWED_INVISIBLE_S) as (broker, endpoint):
        time.sleep(1.5)  # the front's stop released nothing: still invisible, its receipt still good
        assert _ack(endpoint, group, held, "client-1") == pb.OK
        assert _receive(endpoint, group, topic, "client-2", auto_renew=False, wait_s=int(RENEWED_INVISIBLE_S) + 1) == []


def _held_comes_back_within_10_s(tmp_path: Path, option: str, value: str,
                                 meanwhile: Callable[[GrpcBroker], None]) -> None:
    """``serve OPTION VALUE``: a message client-1 holds (``auto_renew``) is received by
    client-2 within 10 s once ``meanwhile`` happened (the option's default, 30 s, would keep it
    longer)."""
    broker = start_grpc_broker(tmp_path / "broker", option, value)
    try:
        topic, group = _name("back"), _name("group")
        with broker.native() as native:
            native.send(Message(topic=topic, body=b"held"))
        [held] = _receive(broker.endpoint, group, topic, "client-1", auto_renew=True, wait_s=5)
        meanwhile(broker)
        [again] = _receive(broker.endpoint, group, topic, "client-2", auto_renew=False, wait_s=10)
        assert again.system_properties.message_id == held.system_properties.message_id
    finally:
        broker.process.stop()


def test_serve_sets_when_a_silent_client_counts_as_gone(tmp_path: Path) -> None:
    """``serve --grpc-client-gone-after-s 1``: a client whose Telemetry stream closed and that
    gives no sign of life for a second has its held messages released."""

    def stream_closes(broker: GrpcBroker) -> None:
        quiet = threading.Event()
        telemetry = _telemetry(broker.endpoint, "client-1", quiet)
        time.sleep(0.5)  # the stream is open
        quiet.set()
        telemetry.join(timeout=10)

    _held_comes_back_within_10_s(tmp_path, "--grpc-client-gone-after-s", "1", stream_closes)


def test_serve_sets_how_soon_a_held_message_comes_back_once_no_broker_renews_it(tmp_path: Path) -> None:
    """``serve --grpc-push-invisible-s 2``: a message a push consumer held when the broker's
    process was killed comes back about 2 s later, once nothing renews it."""

    def killed_and_started(broker: GrpcBroker) -> None:
        broker.process.kill()
        broker.process.start()
        wait_for_port(broker.grpc_port, process=broker.process)

    _held_comes_back_within_10_s(tmp_path, "--grpc-push-invisible-s", "2", killed_and_started)
