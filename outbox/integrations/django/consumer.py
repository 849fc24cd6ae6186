"""The idempotent consumer for Django: the ConsumedMessage row and the handler's writes
commit together, so a redelivered message has no second effect."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from broker_embedded import ReceivedMessage

from ...consumer import GROUP_ATTRIBUTE, AlreadyConsumed
from .models import ConsumedMessage

log = logging.getLogger("outbox.integrations.django.consumer")


def idempotent_consumer(group: str, using: str = "default") -> Callable[[Callable[[ReceivedMessage], Any]], Callable[[ReceivedMessage], bool]]:
    """Wrap ``handler(received)``; the wrapper returns False for a duplicate (skipped)."""

    def decorate(handler: Callable[[ReceivedMessage], Any]) -> Callable[[ReceivedMessage], bool]:
        @functools.wraps(handler)
        def wrapper(received: ReceivedMessage) -> bool:
            try:
                with transaction.atomic(using=using):
                    try:
                        ConsumedMessage.objects.using(using).create(
                            consumer_group=group, message_id=received.message.message_id,
                            topic=received.message.topic, transaction_id=received.transaction_id,
                            consumed_at=timezone.now(),
                        )
                    except IntegrityError:
                        raise AlreadyConsumed from None
                    handler(received)
            except AlreadyConsumed:
                log.info("message %s already consumed by %s; skipped", received.message.message_id, group)
                return False
            return True

        setattr(wrapper, GROUP_ATTRIBUTE, group)
        return wrapper

    return decorate
