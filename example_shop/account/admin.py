from django.contrib import admin

from .models import Customer, Order

admin.site.register(Customer, list_display=["name", "balance"])
admin.site.register(Order, list_display=["order_id", "customer", "amount", "transaction_id", "created_at"])
