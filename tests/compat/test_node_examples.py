"""The example programs of rocketmq-client-nodejs 1.0.x (``nodejs/examples/`` of
apache/rocketmq-clients), each as a program of our own (tests/compat/node/examples.js) making
the same client calls with the same settings against the broker's gRPC port, asserting what
arrives; no message may be ``corrupted``. ``ProducerSingleton.ts`` is the settings the others
import (endpoints, an empty namespace, no credentials). ``ProducerRecallMessageExample.ts`` is
run by ``test_node_client.py::test_recall_a_delayed_message``. The examples' delays (5 s,
10 s) are shortened to 2 s; push consumers, which the examples run until Ctrl+C, are killed
once their messages are in (their shutdown waits out a 20 s long poll)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker_embedded import Message
from broker_embedded.broker.config import BrokerConfig

from .conftest import GrpcBroker, InProcess, NodeClient, eventually


@pytest.fixture(scope="module")
def examples(node: NodeClient) -> NodeClient:
    return NodeClient(node.node_modules, node.home, "examples.js")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _received(examples: NodeClient, example: str, endpoint: str, topic: str) -> list[dict[str, Any]]:
    """The messages one run of a SimpleConsumer example received (and acked; ``run`` asserts
    none is corrupted)."""
    [record] = examples.run(example, endpoint=endpoint, topic=topic, group=_name("group"))
    return list(record["received"])


def test_producer_cjs_and_simple_consumer_cjs(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """Producer.cjs sends a 'nodejs-demo' message; SimpleConsumer.cjs, subscribed to that tag,
    receives it and not a message with another tag."""
    topic = _name("TopicTest")
    [sent] = examples.run("producer-cjs", endpoint=grpc_broker.endpoint, topic=topic)
    with grpc_broker.native() as native:
        native.send(Message(topic=topic, body=b"other", tag="other"))
    [got] = _received(examples, "simple-consumer-cjs", grpc_broker.endpoint, topic)
    assert (got["messageId"], got["tag"]) == (sent["messageId"], "nodejs-demo")
    assert json.loads(got["body"])["hello"] == "rocketmq-client-nodejs world 😄"


def test_producer_ts_normal_and_simple_consumer_ts(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """Producer.ts and ProducerNormalMessageExample.ts send; SimpleConsumer.ts ('*',
    awaitDuration 3 s, one receive of 20) gets both."""
    topic = _name("TopicTestForNormal")
    sent = [record["messageId"] for example in ("producer-ts", "normal")
            for record in examples.run(example, endpoint=grpc_broker.endpoint, topic=topic)]
    got = _received(examples, "simple-consumer-ts", grpc_broker.endpoint, topic)
    assert sorted(message["messageId"] for message in got) == sorted(sent)
    assert sorted(message["tag"] for message in got) == ["nodejs-demo", "nodejs-normal"]


def test_producer_delay_message_example(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """ProducerDelayMessageExample.ts: a Date ``deliveryTimestamp``; the message arrives, not
    before it. The receipt's offset is -1: the message is in no queue until it is due."""
    topic = _name("time-topic")
    [sent] = examples.run("delay", endpoint=grpc_broker.endpoint, topic=topic, delayMs=2000)
    assert sent["offset"] == "-1"
    with grpc_broker.native() as native:
        got = eventually(lambda: native.receive(_name("group"), topic, wait_s=1))
    assert time.time() * 1000 >= sent["dueMs"]
    assert [(m.message.message_id, m.message.tag) for m in got] == [(sent["messageId"], "rocketmq-delay")]


def test_producer_priority_message_example(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """ProducerPriorityMessageExample.ts: priorities 1, 5, 10 and 100 are sent (the client
    refuses the three invalid sends itself); SimpleConsumer.ts gets them, highest first."""
    topic = _name("yourPriorityTopic")
    records = examples.run("priority", endpoint=grpc_broker.endpoint, topic=topic)
    assert [record["priority"] for record in records if "priority" in record] == [1, 5, 10, 100]
    assert all(record["refused"] for record in records if "refused" in record)
    assert len(records) == 7
    got = _received(examples, "simple-consumer-ts", grpc_broker.endpoint, topic)
    assert [(message["priority"], message["tag"]) for message in got] == [
        (100, "critical-priority"), (10, "high-priority"), (5, "medium-priority"), (1, "low-priority")]


def test_producer_transaction_message_example(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """ProducerTransactionMessageExample.ts: a committed transaction of a message tagged '*'
    (the singleton's default tag)."""
    topic = _name("TopicTestForTransaction")
    [sent] = examples.run("transaction", endpoint=grpc_broker.endpoint, topic=topic)
    [got] = _received(examples, "simple-consumer-ts", grpc_broker.endpoint, topic)
    assert (got["messageId"], got["tag"]) == (sent["messageId"], "*")


def test_lite_producer_example(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """LiteProducerExample.ts: each lite message is refused by the broker, saying why."""
    topic = _name("yourParentTopic")
    records = examples.run("lite-producer", endpoint=grpc_broker.endpoint, topic=topic, count=2)
    assert len(records) == 2
    assert all("lite topics (LITE messages) are not implemented" in record["failed"]
               and record["kind"] == "UnsupportedException" for record in records)
    with grpc_broker.native() as native:
        assert native.receive(_name("group"), topic) == []


def test_lite_push_consumer_example(grpc_broker: GrpcBroker, examples: NodeClient) -> None:
    """LitePushConsumerExample.ts: it starts; each ``subscribeLite`` is refused UNIMPLEMENTED."""
    records = examples.run("lite-push-consumer", endpoint=grpc_broker.endpoint, topic=_name("your-parent-topic"),
                           group=_name("group"))
    assert [record["refused"] for record in records] == ["lite-topic-1", "lite-topic-2", "lite-topic-3"]
    assert all("SyncLiteSubscription is not implemented" in record["error"] for record in records)


@dataclass
class PushExample:
    """A running push consumer example: the deliveries and completions it reported."""

    records: list[dict[str, Any]] = field(default_factory=list)

    def delivered(self) -> list[dict[str, Any]]:
        return [record["delivered"] for record in list(self.records) if "delivered" in record]


@contextmanager
def push_example(examples: NodeClient, settings: str, endpoint: str, topic: str, group: str) -> Iterator[PushExample]:
    """A push consumer example started with ``settings`` (see examples.js), killed on leaving,
    when none of its deliveries may have been ``corrupted``."""
    process = examples.start("push-consumer", settings=settings, endpoint=endpoint, topic=topic, group=group)
    running = PushExample()
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        assert ready.get("ready") and ready["group"] == group, process.stderr.read() if process.stderr else ""
        reader = threading.Thread(target=lambda: running.records.extend(map(json.loads, process.stdout or ())),
                                  daemon=True)
        reader.start()
        yield running
    finally:
        process.kill()
        process.communicate(timeout=30)
    assert not any(delivered["corrupted"] for delivered in running.delivered())


@pytest.mark.parametrize("settings", ["push", "quickStart"])
def test_push_consumer_examples(grpc_broker: GrpcBroker, examples: NodeClient, settings: str) -> None:
    """PushConsumer.ts (a namespace, placeholder credentials, cache and polling settings) and
    PushConsumerQuickStart.ts: every message once, none corrupted, each acked."""
    topic, group = _name("yourTopic1"), _name("yourConsumerGroup")
    bodies = [f"order {n}" for n in range(5)]
    with grpc_broker.native() as native, push_example(examples, settings, grpc_broker.endpoint, topic, group) as pushed:
        for body in bodies:
            native.send(Message(topic=topic, body=body.encode(), tag="created"))
        assert eventually(lambda: sorted(d["body"] for d in pushed.delivered()) == bodies)
        assert eventually(lambda: sum(native.stats().consumer_lag.get(group, {}).values()) == 0)
    assert sorted(d["body"] for d in pushed.delivered()) == bodies


@pytest.mark.parametrize("settings", ["fifo", "fifoAccelerator"])
def test_fifo_producer_and_push_consumer_examples(in_process: Callable[..., InProcess], examples: NodeClient,
                                                  settings: str) -> None:
    """ProducerFifoMessageExample.ts's three message groups, consumed by
    PushConsumerFifoMessageExample.ts / PushConsumerFifoAcceleratorExample.ts (a FIFO group,
    the FIFO accelerator): each group's messages in the order sent, one at a time."""
    topic, group = _name("TopicTestForFifo"), _name("nodejs-unittest-group")
    served = in_process(BrokerConfig(), fifo_groups=(group,))
    sent = examples.run("fifo", endpoint=served.endpoint, topic=topic)
    assert len(sent) == 10
    with push_example(examples, settings, served.endpoint, topic, group) as pushed:
        assert eventually(lambda: sum("done" in record for record in pushed.records) == 10)
    delivered = pushed.delivered()
    for message_group in ("Order-001", "Order-002", "Account-Alice"):
        ids = [record["messageId"] for record in sent if record["messageGroup"] == message_group]
        assert [d["messageId"] for d in delivered if d["messageGroup"] == message_group] == ids
        # one at a time: each is delivered only after the previous one of its group was done
        events = [(record["at"], "done" in record) for record in pushed.records
                  if record.get("done") in ids or record.get("delivered", {}).get("messageId") in ids]
        assert [done for _, done in events] == [False, True] * len(ids)
