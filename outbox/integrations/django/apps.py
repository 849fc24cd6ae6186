from django.apps import AppConfig


class OutboxConfig(AppConfig):
    """halfmoon's transactional outbox for Django."""

    name = "outbox.integrations.django"
    label = "halfmoon_outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from .checks import register_checks
        from .conf import reset_producer, start_answering_check_backs

        setting_changed.connect(reset_producer, dispatch_uid="halfmoon_outbox_reset_producer")
        register_checks()
        start_answering_check_backs()
