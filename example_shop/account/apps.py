from django.apps import AppConfig


class AccountConfig(AppConfig):
    name = "example_shop.account"
    label = "shop_account"
    verbose_name = "Shop accounts"
    default_auto_field = "django.db.models.BigAutoField"
