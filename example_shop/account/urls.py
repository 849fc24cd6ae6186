from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.home),
    path("orders", views.orders),
    path("api/customers", views.customers),
    path("api/orders", views.order_list),
    path("admin/", admin.site.urls),
]
