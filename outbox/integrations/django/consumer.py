"""The idempotent consumer for Django: the consumed_message row and the handler's writes
commit together, so a redelivered message has no second effect (the rule:
``outbox.idempotency``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import transaction

from broker_embedded import ReceivedMessage

from ...idempotency import GROUP_ATTRIBUTE, record_or_skip
from .recorder import RECORDER


def idempotent_consumer(group: str, using: str = "default") -> Callable[[Callable[[ReceivedMessage], Any]], Callable[[ReceivedMessage], bool]]:
    """Wrap ``handler(received)``; the wrapper returns False for a duplicate (skipped)."""

    def decorate(handler: Callable[[ReceivedMessage], Any]) -> Callable[[ReceivedMessage], bool]:
        @functools.wraps(handler)
        def wrapper(received: ReceivedMessage) -> bool:
            return record_or_skip(group, received, lambda: transaction.atomic(using=using),
                                  functools.partial(RECORDER.record_consumed, using),
                                  lambda: handler(received))

        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate
