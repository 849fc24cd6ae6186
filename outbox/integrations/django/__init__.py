"""The Django app: ``INSTALLED_APPS += ["outbox.integrations.django"]``.

Settings live in ``OUTBOX = {...}`` (see ``conf``); the decorator, ``send`` and the
idempotent consumer are in ``transactional`` and ``consumer``.
"""
