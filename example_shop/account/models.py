"""Customers with a balance, and the orders paid from it."""

from __future__ import annotations

from django.db import models


class Customer(models.Model):
    """A shop customer; ``balance`` is in whole currency units."""

    name = models.CharField(max_length=64, unique=True)
    balance = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.name} ({self.balance})"


class Order(models.Model):
    """A paid order. Orders that fail (e.g. insufficient balance) roll back and leave no row."""

    order_id = models.CharField(max_length=64, primary_key=True)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    amount = models.BigIntegerField()
    transaction_id = models.CharField(max_length=64, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.order_id}: {self.amount} by {self.customer.name}"
