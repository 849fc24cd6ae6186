"""The framework's tables as Django models (same table and column names as everywhere)."""

from __future__ import annotations

from django.db import models

from ...schema import (
    GROUP_LENGTH,
    MESSAGE_ID_LENGTH,
    STORED_MESSAGE,
    STORED_MESSAGE_GROUP_INDEX,
    STORED_MESSAGE_RELAYED_INDEX,
    TOPIC_LENGTH,
    TRANSACTION_ID_LENGTH,
)


class TransactionLog(models.Model):
    """One row per transaction id: COMMITTED by the producer, or ROLLED_BACK by a fence."""

    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    STATES = [(COMMITTED, "committed"), (ROLLED_BACK, "rolled back (fenced)")]

    transaction_id = models.CharField(max_length=64, primary_key=True)
    producer_group = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=STATES)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "outbox_transaction_log"
        verbose_name = "transaction log entry"
        verbose_name_plural = "transaction log"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["created_at"], name="outbox_txlog_created_at_idx")]

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.state}"


class ConsumedMessage(models.Model):
    """A message a consumer group handled, written with the handler's own writes."""

    consumer_group = models.CharField(max_length=128)
    message_id = models.CharField(max_length=64)
    topic = models.CharField(max_length=255)
    transaction_id = models.CharField(max_length=64, null=True, blank=True)
    consumed_at = models.DateTimeField()

    class Meta:
        db_table = "outbox_consumed_message"
        constraints = [
            models.UniqueConstraint(fields=["consumer_group", "message_id"], name="uniq_outbox_consumed_message")
        ]
        ordering = ["-consumed_at"]
        indexes = [models.Index(fields=["consumed_at"], name="outbox_consumed_at_idx")]

    def __str__(self) -> str:
        return f"{self.consumer_group}:{self.message_id}"


class StoredMessage(models.Model):
    """A message a call stored in its own transaction while the broker was down
    (``OUTBOX["ON_BROKER_DOWN"] = "store"``, ``outbox.stored``); the relay hands it to the
    broker in ``seq`` order and sets ``relayed_at``."""

    seq = models.BigAutoField(primary_key=True)
    message_id = models.CharField(max_length=MESSAGE_ID_LENGTH)
    transaction_id = models.CharField(max_length=TRANSACTION_ID_LENGTH)
    producer_group = models.CharField(max_length=GROUP_LENGTH)
    topic = models.CharField(max_length=TOPIC_LENGTH)
    message_group = models.CharField(max_length=GROUP_LENGTH, null=True, blank=True)
    #: ``outbox.stored.encode`` of the message (body, keys, tag, properties, delay)
    message = models.BinaryField()
    created_at = models.DateTimeField()
    relayed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = STORED_MESSAGE
        constraints = [models.UniqueConstraint(fields=["message_id"], name="uniq_outbox_stored_message_id")]
        indexes = [
            models.Index(fields=["relayed_at", "seq"], name=STORED_MESSAGE_RELAYED_INDEX),
            models.Index(fields=["producer_group", "message_group", "relayed_at"], name=STORED_MESSAGE_GROUP_INDEX),
        ]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.message_id} ({self.topic}, transaction {self.transaction_id})"


class PendingTransaction(TransactionLog):
    """Admin-only view of the broker's pending and parked transactions."""

    class Meta:
        proxy = True
        verbose_name = "pending or parked transaction"
        verbose_name_plural = "pending and parked transactions"
