"""The Django app: ``INSTALLED_APPS += ["outbox.integrations.django"]``.

Settings live in ``OUTBOX = {...}`` (see ``conf``); the decorator, ``send`` and the
idempotent consumer are in ``transactional`` and ``consumer``, the transaction log in
``recorder``.

May import the outbox core, the Celery integration's ORM-free tasks and Django; never
SQLAlchemy (``.importlinter``).
"""
