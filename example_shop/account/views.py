"""The account service's HTTP API and pages.

``POST /orders`` ``{"order_id", "customer", "amount"}`` pays an order inside
``@transactional_message``: the balance is taken and ``order.paid`` is sent, or neither.
The demo injects crashes with the ``X-Shop-Fault`` header (``crash-after-commit``,
``crash-before-commit``): the process SIGKILLs itself at that point.
"""

from __future__ import annotations

import json
import os
import signal

from django.db import transaction
from django.db.models import F, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from outbox import BrokerError, TransactionState
from outbox.integrations.django.conf import producer
from outbox.integrations.django.transactional import current_transaction_id, transactional_message

from .models import Customer, Order

FAULTS = {"crash-after-commit", "crash-before-commit"}


class InsufficientBalance(Exception):
    """The customer cannot pay; the transaction rolls back and ROLLBACK is sent."""


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@transactional_message(
    topic="order.paid",
    body=lambda order_id, customer, amount, fault=None: {"order_id": order_id, "customer": customer, "amount": amount},
    keys=lambda order_id, *_, **__: [order_id],
)
def pay(order_id: str, customer: str, amount: int, fault: str | None = None) -> Order:
    """Take ``amount`` from ``customer`` and record the order; ``order.paid`` goes with it."""
    updated = Customer.objects.filter(name=customer, balance__gte=amount).update(balance=F("balance") - amount)
    if not updated:
        raise InsufficientBalance(f"{customer} cannot pay {amount}")
    order = Order.objects.create(
        order_id=order_id, customer=Customer.objects.get(name=customer), amount=amount,
        transaction_id=current_transaction_id() or "",
    )
    if fault == "crash-before-commit":
        _die()
    if fault == "crash-after-commit":
        # Runs before the framework's own on_commit: committed, COMMIT not yet sent.
        transaction.on_commit(_die)
    return order


@csrf_exempt
@require_http_methods(["POST"])
def orders(request: HttpRequest) -> JsonResponse:
    try:
        data = json.loads(request.body)
        order_id, customer, amount = str(data["order_id"]), str(data["customer"]), int(data["amount"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "expected order_id, customer, amount"}, status=400)
    if amount <= 0:
        return JsonResponse({"error": "amount must be positive"}, status=400)
    fault = request.headers.get("X-Shop-Fault")
    try:
        order = pay(order_id, customer, amount, fault if fault in FAULTS else None)
    except InsufficientBalance as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    except BrokerError as exc:
        return JsonResponse({"error": f"broker unavailable: {exc}"}, status=503)
    return JsonResponse({"order_id": order.order_id, "transaction_id": order.transaction_id}, status=201)


@csrf_exempt
@require_http_methods(["POST", "GET"])
def customers(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        data = json.loads(request.body)
        customer, _ = Customer.objects.get_or_create(name=data["name"], defaults={"balance": int(data["balance"])})
        return JsonResponse({"name": customer.name, "balance": customer.balance}, status=201)
    return JsonResponse({"customers": list(Customer.objects.values("name", "balance").order_by("name"))})


def _message_state(transaction_id: str) -> str:
    try:
        return producer().broker.transaction_state(transaction_id).value
    except BrokerError:
        return "unknown"


def order_list(request: HttpRequest) -> JsonResponse:
    rows = [
        {"order_id": o.order_id, "customer": o.customer.name, "amount": o.amount,
         "transaction_id": o.transaction_id, "message": _message_state(o.transaction_id)}
        for o in Order.objects.select_related("customer").order_by("-created_at")[:200]
    ]
    return JsonResponse({"orders": rows, "paid_total": Order.objects.aggregate(t=Sum("amount"))["t"] or 0})


def home(request: HttpRequest) -> HttpResponse:
    orders_shown = Order.objects.select_related("customer").order_by("-created_at")[:50]
    return render(request, "account/home.html", {
        "customers": Customer.objects.order_by("name"),
        "orders": [(o, _message_state(o.transaction_id)) for o in orders_shown],
        "committed": TransactionState.COMMITTED.value,
    })
