"""Check-backs as Celery tasks: ``register(app)`` puts the task in your Celery app;
``checker.make_checker`` is the broker's side; ``worker`` is a standalone app. The purge
task for beat: ``register_purge(app)`` (``purge``)."""

from .check_back import CHECK_TASK, answer_check_back, check_queue, register
from .purge import PURGE_TASK, register_purge

__all__ = ["CHECK_TASK", "PURGE_TASK", "answer_check_back", "check_queue", "register", "register_purge"]
