"""A consumer group's progress across restarts in a row, seeded: whatever mix of sends,
receives, acks, snapshots and restarts a seed draws, an acked message never comes back, a
message's delivery attempts only ever go up by one, one that used its attempts is in
the DLQ once and delivered no more (the consumer snapshot once lost the attempts of
messages in flight), and a message held (received with a long invisible duration) is not
delivered again while held and its receipt acks it after any restarts (a restart once made
every message in flight due at once and refused its receipt), whether its invisible time
was renewed in the meantime with a new receipt or in place (``keep_receipt``, as the gRPC
front renews a push consumer's messages)."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

import pytest

from broker_embedded import EmbeddedBroker, Message, ReceivedMessage
from broker_embedded.errors import UnknownReceiptError

from .conftest import FAST

GROUP, TOPIC = "g", "orders"
#: The invisible duration of every receive; a step waits past it before receiving again.
INVISIBLE_S = 0.03
#: The invisible duration of a receive whose messages are held across steps.
HOLD_S = 60.0
STEPS = 30


class Model:
    """What the consumer of seed ``seed`` saw: each message's last delivery attempt, the acked ones."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.sent: list[str] = []
        self.attempts: dict[str, int] = {}
        self.acked: set[str] = set()
        self.held: dict[str, str] = {}  # message id -> receipt handle, received for HOLD_S

    def receive(self, broker: EmbeddedBroker, max_messages: int) -> list[ReceivedMessage]:
        """Once what was delivered before is due again, receive and check each delivery."""
        time.sleep(INVISIBLE_S * 1.5)
        received = broker.receive(GROUP, TOPIC, max_messages=max_messages, invisible_duration_s=INVISIBLE_S,
                                  wait_s=0)
        for r in received:
            self.delivered(r.message.message_id, r.delivery_attempt)
        return received

    def delivered(self, message_id: str, attempt: int) -> None:
        seed = self.seed
        assert message_id not in self.acked, f"seed {seed}: acked {message_id} delivered again"
        assert message_id not in self.held, f"seed {seed}: held {message_id} delivered again"
        before = self.attempts.get(message_id, 0)
        assert before < FAST.max_delivery_attempts, f"seed {seed}: {message_id} delivered after its last attempt"
        assert attempt == before + 1, f"seed {seed}: {message_id} delivered as attempt {attempt} after {before}"
        self.attempts[message_id] = attempt


def receive_and_ack(broker: EmbeddedBroker, model: Model, rng: random.Random) -> None:
    for received in model.receive(broker, max_messages=rng.randint(1, 4)):
        message_id = received.message.message_id
        if rng.random() < 0.3:
            try:
                broker.ack(GROUP, received.receipt_handle)
            except UnknownReceiptError:
                continue  # a loaded machine let its invisible duration end first: not acked
            model.acked.add(message_id)


def hold(broker: EmbeddedBroker, model: Model, rng: random.Random) -> None:
    """Receive a few messages for ``HOLD_S``, to be acked some steps (and restarts) later."""
    received = broker.receive(GROUP, TOPIC, max_messages=rng.randint(1, 2), invisible_duration_s=HOLD_S, wait_s=0)
    for r in received:
        model.delivered(r.message.message_id, r.delivery_attempt)
        model.held[r.message.message_id] = r.receipt_handle


def renew_held(broker: EmbeddedBroker, model: Model, rng: random.Random) -> None:
    """Renew each held message for ``HOLD_S`` more: in place (its receipt stays the one it
    was received with) or with a new receipt, which the model holds from then on."""
    for message_id, handle in model.held.items():
        keep = rng.random() < 0.5
        renewed = broker.change_invisible_duration(GROUP, handle, HOLD_S, keep_receipt=keep)
        assert (renewed == handle) == keep, f"seed {model.seed}: renewed {message_id} {handle} -> {renewed}"
        model.held[message_id] = renewed


def ack_held(broker: EmbeddedBroker, model: Model) -> None:
    """Ack every held message with the receipt it was received with."""
    for message_id, handle in model.held.items():
        broker.ack(GROUP, handle)  # UnknownReceiptError: a restart forgot the receipt
        model.acked.add(message_id)
    model.held.clear()


@pytest.mark.parametrize("seed", range(8))
def test_progress_survives_restarts_in_a_row(broker_factory: Callable[..., EmbeddedBroker], seed: int) -> None:
    rng = random.Random(seed)
    model = Model(seed)
    broker = broker_factory(default_queues=2)
    for _ in range(STEPS):
        step = rng.random()
        if step < 0.2:
            for _ in range(rng.randint(1, 3)):
                model.sent.append(broker.send(Message(TOPIC, f"m{len(model.sent)}".encode())).message_id)
        elif step < 0.65:
            receive_and_ack(broker, model, rng)
        elif step < 0.7:
            hold(broker, model, rng)
        elif step < 0.75:
            renew_held(broker, model, rng)
        elif step < 0.78:
            ack_held(broker, model)
        else:
            if rng.random() < 0.5:
                broker.store.flush()  # the events stored: a snapshot now cuts the replay past them
            if rng.random() < 0.5:
                broker.write_snapshots()
            broker.close()
            broker = broker_factory(default_queues=2)
    ack_held(broker, model)
    for _ in range(FAST.max_delivery_attempts + 1):  # drain: what is not acked uses its attempts
        model.receive(broker, max_messages=64)
    dead = Counter(m.message.message_id for m in broker.list_dlq(GROUP))
    assert all(n == 1 for n in dead.values()), f"seed {seed}: in the DLQ more than once: {dead}"
    assert set(dead) == set(model.sent) - model.acked, f"seed {seed}: DLQ {sorted(dead)}"
