"""The standalone checker app under its documented name::

    celery -A outbox.integrations.celery.worker worker -Q outbox.check.<group> --pool threads
"""

from .app import app, check_transaction_task

__all__ = ["app", "check_transaction_task"]
