from django.apps import AppConfig


class OutboxConfig(AppConfig):
    """halfmoon's transactional outbox for Django."""

    name = "outbox.integrations.django"
    label = "halfmoon_outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"
