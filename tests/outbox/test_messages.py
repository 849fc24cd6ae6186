"""Message bodies (the JSON encoder), the message template's checks, and Message's own
check of its body (issue 11 items 8 and 9). No database, no broker."""

from __future__ import annotations

import datetime
import json
import math
import uuid
from decimal import Decimal

import pytest

from broker_embedded import Message
from broker_embedded.errors import InvalidMessageError, InvalidTopicError
from outbox import (
    BodyNotSerializableError,
    MessageTemplate,
    OutboxJSONEncoder,
    json_message,
    message_json,
)
from outbox.messages import to_json_bytes

WHEN = datetime.datetime(2026, 11, 23, 13, 5, 7, 123456, tzinfo=datetime.UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_ordinary_values_serialise_with_the_default_encoder() -> None:
    value = {"amount": Decimal("19.90"), "at": WHEN, "day": WHEN.date(), "time": WHEN.time(), "id": ID}
    assert json.loads(to_json_bytes(value)) == {
        "amount": "19.90", "at": "2026-11-23T13:05:07.123456+00:00", "day": "2026-11-23",
        "time": "13:05:07.123456", "id": "12345678-1234-5678-1234-567812345678"}


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", float("nan")])
def test_other_values_still_raise_body_not_serializable(value: object) -> None:
    with pytest.raises(BodyNotSerializableError):
        to_json_bytes({"v": value})


def test_an_encoder_of_ones_own_is_used() -> None:
    class Cents(OutboxJSONEncoder):
        def default(self, o: object) -> object:
            return int(o * 100) if isinstance(o, Decimal) else super().default(o)

    message = json_message("order.paid", {"amount": Decimal("1.25"), "at": WHEN}, encoder=Cents, tag="t")
    assert message_json(message) == {"amount": 125, "at": "2026-11-23T13:05:07.123456+00:00"}
    assert message.tag == "t"


@pytest.mark.parametrize("body", ["text", {"a": 1}, 42, None, ["x"]])
def test_a_message_body_that_is_not_bytes_fails_at_construction(body: object) -> None:
    with pytest.raises(InvalidMessageError, match="body must be bytes"):
        Message("order.paid", body)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [b"x", bytearray(b"x"), memoryview(b"x")])
def test_bytes_like_bodies_are_messages(body: bytes) -> None:
    assert bytes(Message("order.paid", body).body) == b"x"


@pytest.mark.parametrize("options", [
    {"delay_level": 19},
    {"transaction_timeout_s": math.inf},
    {"keys": "one-key"},
    {"keys": ["has space"]},
    {"tag": "a tag"},
    {"message_group": ""},
    {"properties": {"name": 1}},
])
def test_a_template_the_broker_would_refuse_fails_at_once(options: dict[str, object]) -> None:
    fields: dict[str, object] = {"topic": "order.paid", **options}
    with pytest.raises(InvalidMessageError):
        MessageTemplate(**fields)  # type: ignore[arg-type]


def test_a_template_on_a_reserved_topic_fails_at_once() -> None:
    with pytest.raises(InvalidTopicError):
        MessageTemplate("%DLQ%orders")


def test_the_encoder_must_be_a_json_encoder() -> None:
    with pytest.raises(TypeError, match="JSONEncoder"):
        MessageTemplate("order.paid", encoder=dict)  # type: ignore[arg-type]


def test_a_template_builds_each_call_from_its_arguments() -> None:
    def pay(session: object, order_id: str, amount: Decimal, *, note: str = "none", **extra: object) -> None:
        raise AssertionError("not called")

    template = MessageTemplate(
        "order.paid", keys=lambda order_id, amount, **_: [order_id], tag="paid",
        message_group=lambda order_id, amount, **_: f"user-{order_id}", delay_level=2,
        transaction_timeout_s=30.0, properties=lambda order_id, amount, **_: {"currency": "EUR"},
    ).for_function(pay, skip_first=True)
    message = template.message("o-1", Decimal("2.50"), channel="web")
    assert message_json(message) == {"order_id": "o-1", "amount": "2.50", "note": "none", "channel": "web"}
    assert (message.keys, message.tag, message.message_group, message.delay_level,
            message.transaction_timeout_s, dict(message.properties)) == (
        ("o-1",), "paid", "user-o-1", 2, 30.0, {"currency": "EUR"})
    with pytest.raises(TypeError):
        template.message()  # the call does not fit the function: refused before anything


def test_a_message_built_from_unusable_arguments_is_refused() -> None:
    template = MessageTemplate("order.paid", message_group=lambda user: user).for_function(lambda user: None)
    assert template.message("u1").message_group == "u1"
    with pytest.raises(InvalidMessageError):
        template.message("two words")


def test_both_decorators_take_one_definition_of_the_message_options() -> None:
    """The options are typed once (``MessageOptions``), are the template's fields, and
    both decorators take exactly them, a misspelled one refused by name."""
    import dataclasses
    import inspect

    from outbox.integrations.django import transactional as django_decorator
    from outbox.integrations.sqlalchemy import decorator as sqlalchemy_decorator
    from outbox.template import MessageOptions

    fields = {field.name for field in dataclasses.fields(MessageTemplate)} - {"topic"}
    assert set(MessageOptions.__optional_keys__) == fields
    for module in (django_decorator, sqlalchemy_decorator):
        options = inspect.signature(module.transactional_message).parameters["options"]
        assert (options.kind, options.annotation) == (options.VAR_KEYWORD, "Unpack[MessageOptions]")
    template = MessageTemplate.from_options("order.paid", {"tag": "paid", "properties": None})
    assert (template.tag, template.properties, template.encoder) == ("paid", {}, None)
    with pytest.raises(TypeError, match="'tga'"):
        MessageTemplate.from_options("order.paid", {"tga": "paid"})  # type: ignore[typeddict-unknown-key]
