"""A message in flight keeps its invisible time and its receipt across a broker restart (as
RocketMQ's pop checkpoints keep them): it is not delivered again before its time, the
receipt its consumer holds still acks it (or changes its invisible duration), and a clock
that went back while the broker was down holds it no longer than it was given. Restarts
of three kinds: a clean close (the consumer snapshot carries the receipts), a SIGKILL after
the delivery events were flushed (only the events do), and a SIGKILL after a snapshot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.errors import UnknownReceiptError

from ..sim.clock import SimClock
from .conftest import FAST

GROUP, TOPIC = "g", "orders"
ROOT = Path(__file__).resolve().parents[2]

#: A child that sends three messages, receives them (invisible 30 s), prints their receipts,
#: then (argv[2]) closes, or flushes the events (and writes the snapshots) and waits for its SIGKILL.
CHILD = """
import json, sys
from broker_embedded import EmbeddedBroker, Message
from tests.broker.conftest import FAST
broker = EmbeddedBroker(sys.argv[1], FAST)
for n in range(3):
    broker.send(Message("orders", b"m%d" % n))
received = broker.receive("g", "orders", max_messages=3, invisible_duration_s=30)
how = sys.argv[2]
if how == "close":
    broker.close()
else:
    broker.store.flush()  # the delivery events are stored (as the group commit does within its interval)
    if how == "snapshot, then SIGKILL":
        broker.write_snapshots()
print(json.dumps({r.message.body.decode(): r.receipt_handle for r in received}), flush=True)
sys.stdin.read()  # until killed, or told to end
"""


def deliver_then_stop(data: Path, how: str) -> dict[str, str]:
    """Run ``CHILD`` on ``data``, stopping it ``how``; the receipt handle of each body."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), how], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None
        handles: dict[str, str] = json.loads(child.stdout.readline())
        if how != "close":
            child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    return handles


@pytest.mark.parametrize("how", ["close", "SIGKILL", "snapshot, then SIGKILL"])
def test_a_receipt_from_before_a_restart_acks_its_message_which_stays_invisible(
        tmp_path: Path, how: str) -> None:
    data = tmp_path / "broker"
    handles = deliver_then_stop(data, how)
    with EmbeddedBroker(data, FAST) as broker:
        assert broker.receive(GROUP, TOPIC, max_messages=10) == []  # in flight: not due for 30 s
        assert sum(q.in_flight for q in broker.consumer_queues() if q.topic == TOPIC) == 3
        broker.ack(GROUP, handles["m0"])
        renewed = broker.change_invisible_duration(GROUP, handles["m1"], 1)
        with pytest.raises(UnknownReceiptError):
            broker.ack(GROUP, handles["m1"])  # replaced by the renewal
    with EmbeddedBroker(data, FAST) as broker:  # a second restart keeps the renewal
        with pytest.raises(UnknownReceiptError):
            broker.ack(GROUP, handles["m0"])  # acked: done
        again = broker.receive(GROUP, TOPIC, max_messages=10, wait_s=10)
        assert [(r.message.body, r.delivery_attempt) for r in again] == [(b"m1", 2)]
        with pytest.raises(UnknownReceiptError):
            broker.ack(GROUP, renewed)  # delivered again since
        broker.ack(GROUP, handles["m2"])
        broker.ack(GROUP, again[0].receipt_handle)
        assert broker.receive(GROUP, TOPIC, max_messages=10) == []
        assert sum(q.lag for q in broker.consumer_queues() if q.group == GROUP) == 0


def test_a_clock_that_went_back_while_the_broker_was_down_holds_a_message_no_longer_than_given(
        tmp_path: Path) -> None:
    clock = SimClock()
    config = replace(FAST, store=replace(FAST.store, clock=clock))
    with EmbeddedBroker(tmp_path / "broker", config) as broker:
        broker.send(Message(TOPIC, b"m"))
        [first] = broker.receive(GROUP, TOPIC, invisible_duration_s=60)
    clock.advance(-3600)  # the broker starts again an hour "earlier"
    with EmbeddedBroker(tmp_path / "broker", config) as broker:
        clock.advance(59)
        assert broker.receive(GROUP, TOPIC) == []
        clock.advance(2)
        with pytest.raises(UnknownReceiptError):
            broker.ack(GROUP, first.receipt_handle)  # its 60 s are over on this clock too
        [again] = broker.receive(GROUP, TOPIC)
        assert again.delivery_attempt == 2


def test_an_expired_receipt_from_before_a_restart_is_refused_and_its_message_delivered_again(
        broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message(TOPIC, b"m"))
    [first] = broker.receive(GROUP, TOPIC, invisible_duration_s=0.2)
    broker.close()
    time.sleep(0.3)
    broker = broker_factory()
    with pytest.raises(UnknownReceiptError, match="expired"):
        broker.ack(GROUP, first.receipt_handle)
    [again] = broker.receive(GROUP, TOPIC)
    assert (again.message.body, again.delivery_attempt) == (b"m", 2)


def test_a_renewed_message_from_before_a_restart_comes_back_whatever_the_groups_filter_became(
        broker_factory) -> None:
    """Its receipt read the message back before any receive did; a receive whose tag filter
    no longer matches it must not count it as passed over (done): a message delivered
    already comes back until acked."""
    broker = broker_factory(default_queues=1)
    broker.send(Message(TOPIC, b"red", tag="red"))
    [red] = broker.receive(GROUP, TOPIC, invisible_duration_s=30, filter_expression="red")
    broker.close()
    broker = broker_factory(default_queues=1)
    broker.change_invisible_duration(GROUP, red.receipt_handle, 2)
    broker.send(Message(TOPIC, b"blue", tag="blue"))
    got = [r.message.body for r in broker.receive(GROUP, TOPIC, max_messages=10, filter_expression="blue")]
    got += [r.message.body for r in broker.receive(GROUP, TOPIC, max_messages=10, filter_expression="blue",
                                                   wait_s=10)]
    assert got == [b"blue", b"red"]
