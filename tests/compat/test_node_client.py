"""The official RocketMQ 5 Node client (rocketmq-client-nodejs 1.0.8, pinned in
tests/compat/node/package.json) against a real ``halfmoon-broker serve --grpc-port`` process:
the core scenarios of test_python_client.py, each run by tests/compat/node/client.js in a
``node`` process. The broker's own state is read back over its native protocol. No message
a scenario reports may be ``corrupted`` (``NodeClient.run`` and ``push_consumer`` assert it)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker_embedded import Message
from broker_embedded.broker.config import BrokerConfig
from broker_embedded.errors import UnknownTransactionError
from broker_embedded.message import TransactionState
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from tests.ports import free_port

from .conftest import GrpcBroker, InProcess, NodeClient, eventually, start_grpc_broker


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _received(node: NodeClient, broker: GrpcBroker, topic: str, count: int, expression: str = "*",
              sql: str = "") -> list[dict[str, Any]]:
    """Receive (and ack) ``count`` messages with a fresh Node SimpleConsumer subscribed with
    the TAG expression ``expression`` (or the SQL92 one ``sql``); asserts none follow."""
    records = node.run("receive", endpoint=broker.endpoint, topic=topic, group=_name("group"), count=count,
                       filter=expression, sql=sql)
    assert records[-1] == {"emptyAfter": True}
    return [message for record in records[:-1] for message in record["batch"]]


def test_send_receive_ack(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("orders")
    messages = [{"body": f"order {n}", "tag": "created", "keys": [f"order-{n}"], "properties": {"source": "test"}}
                for n in range(3)]
    sent = node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=messages)
    got = _received(node, grpc_broker, topic, 3)
    assert sorted(m["body"] for m in got) == ["order 0", "order 1", "order 2"]
    assert sorted(m["messageId"] for m in got) == sorted(r["messageId"] for r in sent)
    assert {m["tag"] for m in got} == {"created"}
    assert sorted(tuple(m["keys"]) for m in got) == [("order-0",), ("order-1",), ("order-2",)]
    assert all(m["properties"] == {"source": "test"} and m["deliveryAttempt"] == 1 for m in got)


def test_simple_consumer_with_a_tag_filter(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """``subscriptions: new Map().set(topic, 'paid || shipped')``: only those tags arrive."""
    topic = _name("orders")
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic,
             messages=[{"body": f"{tag} {n}", "tag": tag} for n, tag in enumerate(("paid", "created", "shipped"))])
    got = _received(node, grpc_broker, topic, 2, "paid || shipped")
    assert sorted(m["body"] for m in got) == ["paid 0", "shipped 2"]


def test_simple_consumer_with_an_sql92_filter(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """``new FilterExpression("amount > 5 AND TAGS = 'paid'", FilterType.SQL)``: the messages
    whose properties and tag match arrive, the others are consumed for the group."""
    topic = _name("orders")
    sent = [("paid", "8"), ("paid", "3"), ("created", "9"), ("paid", "12")]
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic,
             messages=[{"body": f"{tag} {amount}", "tag": tag, "properties": {"amount": amount}} for tag, amount in sent])
    got = _received(node, grpc_broker, topic, 2, sql="amount > 5 AND TAGS = 'paid'")
    assert sorted(m["body"] for m in got) == ["paid 12", "paid 8"]


def test_no_message_is_corrupted(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """The client checks each body against its digest (MD5, upper-case hex, as RocketMQ's proxy
    sends it); bodies of several sizes and non-ASCII ones all pass."""
    topic = _name("digest")
    bodies = ["x", "order paid", "\u00e9t\u00e9 " * 1000]
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=[{"body": body} for body in bodies])
    got = _received(node, grpc_broker, topic, len(bodies))
    assert sorted(m["body"] for m in got) == sorted(bodies)
    assert [m["corrupted"] for m in got] == [False] * len(bodies)


def test_commit_is_visible_and_rollback_never(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("tx")
    committed, rolled_back = node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=[
        {"body": "committed", "ends": ["commit"]}, {"body": "rolled back", "ends": ["rollback"]}])
    assert committed["transactionId"] == committed["messageId"]  # the transaction id is the message id
    assert committed["ends"] == rolled_back["ends"] == [pb.OK]
    assert [m["body"] for m in _received(node, grpc_broker, topic, 1)] == ["committed"]
    with grpc_broker.native() as native:
        assert native.transaction_state(committed["transactionId"]) is TransactionState.COMMITTED
        assert native.transaction_state(rolled_back["transactionId"]) is TransactionState.ROLLED_BACK


def test_repeated_and_conflicting_end(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    [sent] = node.run("send", endpoint=grpc_broker.endpoint, topic=_name("ends"),
                      messages=[{"body": "commit once", "ends": ["commit", "commit", "rollback"]}])
    # a repeat of the recorded resolution is OK, the opposite one PRECONDITION_FAILED
    assert sent["ends"] == [pb.OK, pb.OK, pb.PRECONDITION_FAILED]
    with grpc_broker.native() as native:
        assert native.transaction_state(sent["transactionId"]) is TransactionState.COMMITTED


def test_check_back_commit_and_rollback(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """Half messages left without END are checked over the Node producer's Telemetry stream;
    its checker's answer resolves them."""
    topic = _name("checked")
    producer = node.start("send", endpoint=grpc_broker.endpoint, topic=topic, stay=True, messages=[
        {"body": "commit me", "ends": []}, {"body": "rollback me", "ends": []}])
    try:
        records = _records_until_ready(producer)
        ids = {r["transactionId"] for r in records if "transactionId" in r}
        with grpc_broker.native() as native:
            assert eventually(lambda: {native.transaction_state(i) for i in ids}
                              == {TransactionState.COMMITTED, TransactionState.ROLLED_BACK})
    finally:
        out, err = producer.communicate(timeout=60)  # closes stdin: the producer shuts down
    assert producer.returncode == 0, err
    checked = {json.loads(line)["checked"] for line in out.splitlines()}
    assert checked == {"commit me", "rollback me"}
    assert [m["body"] for m in _received(node, grpc_broker, topic, 1)] == ["commit me"]


def test_raising_checker_is_unknown_checked_again_then_parked(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("unknown")
    producer = node.start("send", endpoint=grpc_broker.endpoint, topic=topic, stay=True,
                          messages=[{"body": "cannot tell", "ends": []}])
    try:
        [record] = _records_until_ready(producer)
        with grpc_broker.native() as native:
            assert eventually(lambda: native.transaction_state(record["transactionId"]) is TransactionState.PARKED,
                              30)
    finally:
        out, err = producer.communicate(timeout=60)
    assert producer.returncode == 0, err
    # --check-max 3: asked three times, then parked (the checker's error is the client's to log)
    assert [json.loads(line) for line in out.splitlines()] == [{"checked": "cannot tell"}] * 3


def test_commit_after_a_broker_restart(tmp_path: Path, node: NodeClient) -> None:
    """The transaction is the broker's (durable), not a proxy's memory: END after a restart commits."""
    slow_checks = ("--transaction-timeout", "60")  # no check-back meanwhile
    broker = start_grpc_broker(tmp_path / "broker", *slow_checks)
    topic = _name("restart")
    producer = node.start("send", endpoint=broker.endpoint, topic=topic, stay=True,
                          messages=[{"body": "survives", "ends": []}])
    try:
        [sent] = _records_until_ready(producer)
        broker.process.stop()
        broker = start_grpc_broker(tmp_path / "broker", *slow_checks, grpc_port=broker.grpc_port)
        assert eventually(lambda: _end(producer, "commit") == [pb.OK])  # once the channel is back
        with broker.native() as native:
            assert native.transaction_state(sent["transactionId"]) is TransactionState.COMMITTED
        assert [m["body"] for m in _received(node, broker, topic, 1)] == ["survives"]
    finally:
        _, err = producer.communicate(timeout=60)
        broker.process.stop()
    assert producer.returncode == 0, err


def _end(producer: subprocess.Popen[str], resolution: str) -> list[int]:
    """Ask a staying Node producer to end its transactions; their status codes."""
    assert producer.stdin is not None and producer.stdout is not None
    producer.stdin.write(f"{resolution}\n")
    producer.stdin.flush()
    codes: list[int] = json.loads(producer.stdout.readline())["ends"]
    return codes


def _records_until_ready(process: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Read a staying producer's records up to its ``ready`` line."""
    assert process.stdout is not None
    records: list[dict[str, Any]] = []
    for line in process.stdout:
        record = json.loads(line)
        if record.get("ready"):
            return records
        records.append(record)
    raise AssertionError(f"the Node producer ended early: {process.communicate()[1]}")


def test_fifo_one_in_flight_per_group_in_order(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("fifo")
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic,
             messages=[{"body": f"step {n}", "messageGroup": "account-1"} for n in range(4)])
    records = node.run("receive", endpoint=grpc_broker.endpoint, topic=topic, group=_name("group"), count=4)
    batches = [record["batch"] for record in records[:-1]]
    assert [len(batch) for batch in batches] == [1, 1, 1, 1]  # the next of the group waits for the ack
    assert [batch[0]["body"] for batch in batches] == ["step 0", "step 1", "step 2", "step 3"]
    assert {batch[0]["messageGroup"] for batch in batches} == {"account-1"}


def test_delay(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("delayed")
    due_ms = int(time.time() * 1000) + 2000
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=[{"body": "later", "deliveryAtMs": due_ms}])
    [message] = _received(node, grpc_broker, topic, 1)
    assert message["body"] == "later"
    assert message["receivedAtMs"] >= due_ms  # not delivered before its time


def test_change_invisible_duration(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("invisible")
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=[{"body": "slow work"}])
    first, again, empty = node.run("change-invisible-duration", endpoint=grpc_broker.endpoint, topic=topic,
                                   group=_name("group"))
    assert first["first"]["receiptHandle"] != first["firstHandle"]  # the client keeps the new handle
    assert again["again"]["body"] == "slow work" and again["again"]["deliveryAttempt"] == 2
    assert empty == {"emptyAfter": True}



def test_signed_calls_with_the_brokers_keys(tmp_path: Path, node: NodeClient) -> None:
    """With sessionCredentials the Node client signs its calls (MQv2-HMAC-SHA1); without them it
    sends no authorization header, and the broker refuses it (UNAUTHENTICATED)."""
    broker = start_grpc_broker(tmp_path / "broker", "--access-key", "app", "--secret-key", "s3cret")
    try:
        topic, keys = _name("signed"), {"accessKey": "app", "secretKey": "s3cret"}
        [sent] = node.run("send", endpoint=broker.endpoint, topic=topic, messages=[{"body": "signed"}], **keys)
        records = node.run("receive", endpoint=broker.endpoint, topic=topic, group=_name("group"), count=1, **keys)
        assert [m["messageId"] for m in records[0]["batch"]] == [sent["messageId"]]
        refused = node.fails("send", endpoint=broker.endpoint, topic=topic, messages=[{"body": "unsigned"}])
        assert "Failed to fetch topic routes" in refused  # how the client reports the refused QueryRoute
    finally:
        broker.process.stop()


def test_several_brokers_in_one_route(tmp_path: Path, node: NodeClient) -> None:
    """Two brokers behind one static route: the Node client spreads transactions over both and
    answers each broker's check-backs on its own Telemetry stream; its consumer receives from both."""
    ports = [free_port(), free_port()]
    route = ",".join(f"127.0.0.1:{port}" for port in ports)
    brokers = [start_grpc_broker(tmp_path / f"broker-{n}", "--grpc-advertise", route, grpc_port=port)
               for n, port in enumerate(ports)]
    try:
        topic = _name("spread")
        producer = node.start("send", endpoint=brokers[0].endpoint, topic=topic, stay=True,
                              messages=[{"body": f"commit {n}", "ends": []} for n in range(8)])
        try:
            ids = [record["transactionId"] for record in _records_until_ready(producer)]
            assert eventually(lambda: sum(_committed_on(broker, ids) for broker in brokers) == len(ids))
        finally:
            _, err = producer.communicate(timeout=60)
        assert producer.returncode == 0, err
        assert all(_committed_on(broker, ids) for broker in brokers)  # each broker held some
        assert sorted(m["body"] for m in _received(node, brokers[0], topic, 8)) == [f"commit {n}" for n in range(8)]
    finally:
        for broker in brokers:
            broker.process.stop()


def _committed_on(broker: GrpcBroker, transaction_ids: list[str]) -> int:
    """How many of ``transaction_ids`` ``broker`` has committed (the others are the other broker's)."""
    committed = 0
    with broker.native() as native:
        for transaction_id in transaction_ids:
            try:
                committed += native.transaction_state(transaction_id) is TransactionState.COMMITTED
            except UnknownTransactionError:
                pass
    return committed


@dataclass
class PushConsumerProcess:
    """A Node PushConsumer (client.js ``push``): the deliveries it reported so far."""

    process: subprocess.Popen[str]
    deliveries: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> None:
        """Collect the reported deliveries until the process ends (on a reader thread)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            if "delivered" in record:
                self.deliveries.append({**record["delivered"], "failed": record["failed"]})

    def of(self, body: str) -> list[dict[str, Any]]:
        return [delivery for delivery in list(self.deliveries) if delivery["body"] == body]


@contextmanager
def push_consumer(node: NodeClient, endpoint: str, topic: str, group: str,
                  **behaviour: Any) -> Iterator[PushConsumerProcess]:
    """A started Node PushConsumer of ``group``; shut down (stdin closed) on leaving, when
    none of its deliveries may have been ``corrupted``."""
    process = node.start("push", endpoint=endpoint, topic=topic, group=group, **behaviour)
    consumer = PushConsumerProcess(process)
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready and json.loads(ready) == {"ready": True}, process.stderr.read() if process.stderr else ""
        reader = threading.Thread(target=consumer.read, daemon=True)
        reader.start()
        yield consumer
    finally:
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert not any(delivery["corrupted"] for delivery in consumer.deliveries)


def test_push_consumer_gets_every_message_once(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic, group = _name("pushed"), _name("group")
    bodies = [f"order {n}" for n in range(10)]
    with push_consumer(node, grpc_broker.endpoint, topic, group) as consumer:
        node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=[{"body": body} for body in bodies])
        assert eventually(lambda: sorted(d["body"] for d in consumer.deliveries) == sorted(bodies))
        with grpc_broker.native() as native:  # each acked: nothing left for the group
            assert eventually(lambda: sum(native.stats().consumer_lag.get(group, {}).values()) == 0)
    assert sorted(d["body"] for d in consumer.deliveries) == sorted(bodies)  # none twice


@pytest.mark.slow
def test_push_consumer_failure_is_redelivered_then_dead_lettered(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """The Node client nacks a failed message without a back-off (it reads neither back-off of
    the settings): it comes back at once, and after the broker's 16 attempts goes to the DLQ."""
    topic, group = _name("poison"), _name("group")
    with push_consumer(node, grpc_broker.endpoint, topic, group, failPrefix="fail", failTimes=100) as consumer:
        [failing, _] = node.run("send", endpoint=grpc_broker.endpoint, topic=topic,
                                messages=[{"body": "fail always"}, {"body": "fine"}])
        with grpc_broker.native() as native:
            assert eventually(lambda: [m.message.message_id for m in native.list_dlq(group)]
                              == [failing["messageId"]], 60)
    assert [d["deliveryAttempt"] for d in consumer.of("fail always")] == list(range(1, 17))
    assert [d["deliveryAttempt"] for d in consumer.of("fine")] == [1]


def test_push_consumer_keeps_a_message_group_in_order(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    topic = _name("fifo-push")
    messages = [{"body": f"{account} {n}", "messageGroup": f"account-{account}"}
                for n in range(5) for account in ("a", "b")]
    node.run("send", endpoint=grpc_broker.endpoint, topic=topic, messages=messages)
    with push_consumer(node, grpc_broker.endpoint, topic, _name("group"), failPrefix="a 2", failTimes=1) as consumer:
        assert eventually(lambda: len(consumer.deliveries) == 11, 60)  # "a 2" twice
    for account in ("a", "b"):
        expected = [f"{account} {n}" for n in range(5)]
        if account == "a":
            expected.insert(3, "a 2")  # redelivered before the next of its group
        assert [d["body"] for d in consumer.deliveries if d["messageGroup"] == f"account-{account}"] == expected


@pytest.mark.slow
def test_push_consumer_keeps_the_message_a_slow_listener_holds(in_process: Callable[..., InProcess],
                                                               node: NodeClient) -> None:
    """The Node PushConsumer receives with auto_renew: a listener working 4 s on a message
    invisible for 1.5 s gets it once (the broker renews it), and its ack is taken."""
    served = in_process(BrokerConfig(retry_backoff_s=(0.5,)), push_invisible_s=1.5)
    topic, group = _name("slow"), _name("group")
    served.broker.send(Message(topic=topic, body=b"slow work"))
    with push_consumer(node, served.endpoint, topic, group, workMs=4000) as consumer:
        assert eventually(lambda: sum(served.broker.stats().consumer_lag.get(group, {}).values()) == 0
                          and len(consumer.deliveries) == 1)
        time.sleep(2.0)  # unrenewed, it would be back by now
    assert [(d["body"], d["deliveryAttempt"]) for d in consumer.deliveries] == [("slow work", 1)]


def test_recall_a_delayed_message(grpc_broker: GrpcBroker, node: NodeClient) -> None:
    """ProducerRecallMessageExample's calls: a delayed message's receipt has a recall handle,
    ``recallMessage`` takes it back (never delivered), a handle that is not one is refused."""
    topic = _name("recall")
    due_ms = int(time.time() * 1000) + 2000
    records = node.run("recall", endpoint=grpc_broker.endpoint, topic=topic, recall=["recalled"],
                       badHandles=["not-a-handle"],
                       messages=[{"body": "recalled", "deliveryAtMs": due_ms}, {"body": "kept", "deliveryAtMs": due_ms}])
    sent = {r["sent"]: r for r in records if "sent" in r}
    assert sent["recalled"]["recallHandle"] and sent["kept"]["recallHandle"]
    assert [r["messageId"] for r in records if "recalled" in r] == [sent["recalled"]["messageId"]]
    [refusal] = [r["refused"] for r in records if "badHandle" in r]
    assert refusal is not None and "recall handle is invalid" in refusal
    got: list[bytes] = []
    with grpc_broker.native() as native:
        group = _name("group")
        deadline = time.monotonic() + 10
        while b"kept" not in got and time.monotonic() < deadline:
            got += [bytes(m.message.body) for m in native.receive(group, topic, wait_s=1)]
        time.sleep(0.3)  # the recalled one was due with it
        got += [bytes(m.message.body) for m in native.receive(group, topic, wait_s=0)]
    assert got == [b"kept"]


def test_fifo_push_consumer_forwards_what_keeps_failing_to_the_dlq(in_process: Callable[..., InProcess],
                                                                    node: NodeClient) -> None:
    """A PushConsumer of a FIFO group (``fifo_groups``) retries a failed message itself, then
    calls ForwardMessageToDeadLetterQueue: in the DLQ once, the next of its group delivered."""
    topic, group = _name("forward"), _name("group")
    served = in_process(BrokerConfig(max_delivery_attempts=3, retry_backoff_s=(0.5,)), fifo_groups=(group,))
    failing = served.broker.send(Message(topic=topic, body=b"fail always", message_group="account-1"))
    served.broker.send(Message(topic=topic, body=b"next", message_group="account-1"))
    with push_consumer(node, served.endpoint, topic, group, failPrefix="fail", failTimes=100) as consumer:
        assert eventually(lambda: [d.message.message_id for d in served.broker.list_dlq(group)]
                          == [failing.message_id], 30)
        assert eventually(lambda: consumer.of("next"))
        assert eventually(lambda: sum(served.broker.stats().consumer_lag.get(group, {}).values()) == 0)
    assert [d["deliveryAttempt"] for d in consumer.of("fail always")] == [1, 2, 3]  # the client's own retries
    assert [d.message.message_id for d in served.broker.list_dlq(group)] == [failing.message_id]
