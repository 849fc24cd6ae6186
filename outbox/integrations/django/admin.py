"""Admin pages: the transaction log, consumed messages, the stored messages waiting for the
relay, and the broker's pending/parked view (with the stored backlog).

The framework writes every row, so all four are read-only (no add, change or delete, no
bulk delete). A transaction log entry's page shows what the broker holds of it (read when
the page is opened) and links to the messages consumed from it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from broker_embedded import BrokerError

from .backlog import project_backlog
from .conf import ForeignGroupError, outbox_settings, producer
from .models import ConsumedMessage, PendingTransaction, StoredMessage, TransactionLog
from .resolve import broker_transaction, resolve_parked


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """These rows are written by the framework only."""

    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TransactionLog)
class TransactionLogAdmin(ReadOnlyAdmin):
    list_display = ["transaction_id", "producer_group", "state", "created_at", "consumptions"]
    list_filter = ["state", "producer_group", "created_at"]
    search_fields = ["transaction_id"]
    date_hierarchy = "created_at"
    fields = ["transaction_id", "producer_group", "state", "created_at", "in_the_broker", "consumptions"]
    readonly_fields = fields

    @admin.display(description="consumed messages")
    def consumptions(self, entry: TransactionLog) -> str:
        """A link to the consumed_message rows of this transaction."""
        url = reverse(f"{self.admin_site.name}:halfmoon_outbox_consumedmessage_changelist")
        return format_html('<a href="{}?{}">consumptions</a>', url,
                           urlencode({"transaction_id": entry.transaction_id}))

    @admin.display(description="in the broker")
    def in_the_broker(self, entry: TransactionLog) -> str:
        """The broker's state of the transaction and its message ids (asked on this page only)."""
        try:
            held = broker_transaction(entry.transaction_id, entry.producer_group)
        except BrokerError as exc:
            return f"the broker did not say: {exc}"
        queries = format_html_join(
            "", "<li><code>{}</code>: <code>halfmoon-broker query --id {}</code></li>",
            ((message_id, message_id) for message_id in held.message_ids),
        )
        return format_html("{}; messages:<ul>{}</ul>", held.state.value, queries)


@admin.register(ConsumedMessage)
class ConsumedMessageAdmin(ReadOnlyAdmin):
    list_display = ["message_id", "consumer_group", "topic", "transaction_id", "consumed_at"]
    list_filter = ["consumer_group", "topic"]
    search_fields = ["message_id", "transaction_id"]


@admin.register(StoredMessage)
class StoredMessageAdmin(ReadOnlyAdmin):
    """The stored messages the relay has not handed to the broker yet (store mode)."""

    list_display = ["seq", "message_id", "transaction_id", "producer_group", "topic", "message_group", "created_at"]
    list_filter = ["producer_group", "topic"]
    search_fields = ["message_id", "transaction_id"]
    exclude = ["message"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).filter(relayed_at__isnull=True)


@admin.register(PendingTransaction)
class PendingTransactionAdmin(ReadOnlyAdmin):
    """Not a table: the broker's live view, with a button to resolve a parked transaction
    of a producer group owned here by the fencing rule (the transaction_log decides, not the
    operator), on that group's database. Other groups' transactions are listed read-only;
    a resolve posted for one is refused (403)."""

    #: Resolving writes a fence row, so it needs the right to change transaction log entries.
    RESOLVE_PERMISSION = "halfmoon_outbox.change_transactionlog"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST" and "resolve" in request.POST:
            if not request.user.has_perm(self.RESOLVE_PERMISSION):
                raise PermissionDenied
            return self._resolve(request, request.POST["resolve"])
        owned = outbox_settings().owned_groups
        try:
            broker = producer().broker
            stats, parked, error = broker.stats(), broker.list_parked(), None
        except BrokerError as exc:
            stats, parked, error = None, [], str(exc)
        unanswered = getattr(stats, "unanswered_check_groups", {})
        context = {
            **self.admin_site.each_context(request),
            "title": "Pending and parked transactions",
            "opts": self.model._meta,
            "stats": stats,
            "parked": parked,
            "owned_groups": sorted(owned),
            "unanswered": [(group, seconds, group in owned) for group, seconds in sorted(unanswered.items())],
            "error": error,
            "stored_backlog": project_backlog(),
        }
        return TemplateResponse(request, "admin/halfmoon_outbox/pending.html", context)

    def _resolve(self, request: HttpRequest, transaction_id: str) -> HttpResponse:
        try:
            result = resolve_parked(transaction_id)
        except ForeignGroupError as exc:
            raise PermissionDenied(f"transaction {transaction_id}: {exc}") from exc
        except BrokerError as exc:
            self.message_user(request, f"Transaction {transaction_id}: {exc}", messages.ERROR)
        else:
            if result is None:
                self.message_user(request, f"Transaction {transaction_id}: its local transaction still holds "
                                           "the row, try again", messages.WARNING)
            else:
                self.message_user(request, f"Transaction {transaction_id}: {result.state.value}")
        return HttpResponseRedirect(request.path)
