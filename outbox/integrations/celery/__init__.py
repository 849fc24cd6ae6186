"""Check-backs as Celery tasks: ``register(app)`` puts the task in your Celery app;
``checker.make_checker`` is the broker's side; ``worker`` is a standalone app."""

from .check_back import CHECK_TASK, answer_check_back, check_queue, register

__all__ = ["CHECK_TASK", "answer_check_back", "check_queue", "register"]
