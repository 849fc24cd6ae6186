"""The message a ``@transactional_message`` call sends, built from the call's arguments.

Both decorators (SQLAlchemy's and Django's) take the same keyword options, typed once as
``MessageOptions``, and describe their message with one ``MessageTemplate`` built from
them by ``MessageTemplate.from_options``: the topic, the body (a function of the arguments; by default the
arguments by name), keys, tag, message group and properties (fixed, or functions of the
arguments), RocketMQ's delay level, the transaction's check-back timeout, and the JSON
encoder of the body. The template is checked by the broker's own rules when it is made
(``InvalidMessageError`` at decoration), and each message whose keys, message group or
properties come from the call's arguments again when the call builds it, before any
transaction opens.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypedDict, TypeVar

from broker_embedded import Message
from broker_embedded.errors import InvalidMessageError
from broker_embedded.message import validate_message

from .messages import to_json_bytes

T = TypeVar("T")
#: A fixed value, or a function of the decorated call's arguments.
FromArguments: TypeAlias = T | Callable[..., T]


def _value(option: FromArguments[T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    return option(*args, **kwargs) if callable(option) else option  # type: ignore[no-any-return]


def _fixed(option: FromArguments[T], otherwise: T) -> T:
    return otherwise if callable(option) else option


def _keys(keys: Sequence[str]) -> tuple[str, ...]:
    if isinstance(keys, str):
        raise InvalidMessageError(f"keys must be a list of keys, not the string {keys!r}")
    return tuple(keys)


class MessageOptions(TypedDict, total=False):
    """The keyword options of both ``@transactional_message`` decorators (``**options:
    Unpack[MessageOptions]``); each is a field of ``MessageTemplate``, where they are described."""

    body: Callable[..., Any] | None
    keys: FromArguments[Sequence[str]]
    tag: str
    message_group: FromArguments[str | None]
    delay_level: int
    transaction_timeout_s: float | None
    properties: FromArguments[Mapping[str, str]]
    encoder: type[json.JSONEncoder] | None


@dataclass(frozen=True)
class MessageTemplate:
    """What each call of a decorated function sends; see the module docstring."""

    topic: str
    body: Callable[..., Any] | None = None
    keys: FromArguments[Sequence[str]] = ()
    tag: str = ""
    message_group: FromArguments[str | None] = None
    delay_level: int = 0
    transaction_timeout_s: float | None = None
    properties: FromArguments[Mapping[str, str]] = field(default_factory=dict)
    encoder: type[json.JSONEncoder] | None = None

    def __post_init__(self) -> None:
        if self.encoder is not None and not (
                isinstance(self.encoder, type) and issubclass(self.encoder, json.JSONEncoder)):
            raise TypeError(f"encoder must be a json.JSONEncoder subclass, not {self.encoder!r}")
        validate_message(Message(
            self.topic, b"", keys=_keys(_fixed(self.keys, ())), tag=self.tag,
            message_group=_fixed(self.message_group, None), properties=_fixed(self.properties, {}),
            delay_level=self.delay_level, transaction_timeout_s=self.transaction_timeout_s,
        ))

    @classmethod
    def from_options(cls, topic: str, options: MessageOptions,
                     encoder: type[json.JSONEncoder] | None = None) -> MessageTemplate:
        """The template of a decorator's ``topic`` and keyword ``options`` (``encoder``: the
        integration's default); ``TypeError`` for a keyword that is no option."""
        unknown = sorted(set(options) - MessageOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"transactional_message() got an unexpected keyword argument {unknown[0]!r}")
        values: MessageOptions = {"encoder": encoder, **options}
        if values.get("properties", {}) is None:  # the decorators' old default, still taken
            values["properties"] = {}
        return cls(topic, **values)

    def for_function(self, function: Callable[..., Any], skip_first: bool = False) -> BoundTemplate:
        """The template of ``function``'s calls (``skip_first``: its first parameter, the
        session, is not one of the arguments the call passes)."""
        return BoundTemplate(self, function, skip_first)


class BoundTemplate:
    """A template bound to the decorated function: ``message(*args, **kwargs)``."""

    def __init__(self, template: MessageTemplate, function: Callable[..., Any], skip_first: bool) -> None:
        self.template = template
        signature = inspect.signature(function)
        parameters = list(signature.parameters.values())[1 if skip_first else 0:]
        self._signature = signature.replace(parameters=parameters)
        #: Whether a call's message has fields the template did not validate: the others
        #: are the template's (checked when it was made), a new id and JSON bytes.
        self._from_arguments = any(callable(option) for option in
                                   (template.keys, template.message_group, template.properties))

    def _named(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        """The call's arguments by name, defaults included (the default body)."""
        bound.apply_defaults()
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self._signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            else:
                named[name] = list(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
        return named

    def message(self, *args: Any, **kwargs: Any) -> Message:
        """The message of one call, validated (``BodyNotSerializableError``,
        ``InvalidMessageError``, ``TypeError`` for arguments the function does not take, as
        the call itself would raise)."""
        template = self.template
        bound = self._signature.bind(*args, **kwargs)
        value = template.body(*args, **kwargs) if template.body else self._named(bound)
        message = Message(
            template.topic,
            to_json_bytes(value, template.encoder),
            keys=_keys(_value(template.keys, args, kwargs)),
            tag=template.tag,
            message_group=_value(template.message_group, args, kwargs),
            properties=_value(template.properties, args, kwargs),
            delay_level=template.delay_level,
            transaction_timeout_s=template.transaction_timeout_s,
        )
        if self._from_arguments:
            validate_message(message)
        return message
