"""Admin pages: the transaction log, consumed messages, and the broker's pending/parked view."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db import router
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from broker_embedded import BrokerError

from .checks import resolve_parked
from .conf import producer
from .models import ConsumedMessage, PendingTransaction, TransactionLog


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """These rows are written by the framework only."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TransactionLog)
class TransactionLogAdmin(ReadOnlyAdmin):
    list_display = ["transaction_id", "producer_group", "state", "created_at"]
    list_filter = ["state", "producer_group", "created_at"]
    search_fields = ["transaction_id"]
    date_hierarchy = "created_at"


@admin.register(ConsumedMessage)
class ConsumedMessageAdmin(ReadOnlyAdmin):
    list_display = ["message_id", "consumer_group", "topic", "transaction_id", "consumed_at"]
    list_filter = ["consumer_group", "topic"]
    search_fields = ["message_id", "transaction_id"]


@admin.register(PendingTransaction)
class PendingTransactionAdmin(ReadOnlyAdmin):
    """Not a table: the broker's live view, with a button to resolve a parked transaction
    by the fencing rule (the transaction_log decides, not the operator), on the database
    the router picks for writing TransactionLog."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "POST" and "resolve" in request.POST:
            transaction_id = request.POST["resolve"]
            try:
                result = resolve_parked(transaction_id, router.db_for_write(TransactionLog))
            except BrokerError as exc:
                self.message_user(request, f"Transaction {transaction_id}: {exc}", messages.ERROR)
            else:
                if result is None:
                    self.message_user(request, f"Transaction {transaction_id}: its local transaction still holds the row, try again", messages.WARNING)
                else:
                    self.message_user(request, f"Transaction {transaction_id}: {result.state.value}")
            return HttpResponseRedirect(request.path)
        try:
            broker = producer().broker
            stats, parked, error = broker.stats(), broker.list_parked(), None
        except BrokerError as exc:
            stats, parked, error = None, [], str(exc)
        context = {
            **self.admin_site.each_context(request),
            "title": "Pending and parked transactions",
            "opts": self.model._meta,
            "stats": stats,
            "parked": parked,
            "error": error,
        }
        return TemplateResponse(request, "admin/halfmoon_outbox/pending.html", context)
