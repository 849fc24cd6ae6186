"""The account service's consumer side: award points once per paid order."""

from __future__ import annotations

from broker_embedded import ReceivedMessage
from outbox import message_json
from outbox.integrations.django.consumer import idempotent_consumer

from .models import Points


@idempotent_consumer("member")
def award_points(received: ReceivedMessage) -> None:
    body = message_json(received.message)
    Points.objects.create(account=body["name"], points=body["amount"])
