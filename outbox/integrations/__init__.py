"""The outbox on each framework: ``sqlalchemy``, ``django``, ``celery`` (check-back and purge
tasks), and the migration histories (``alembic``, ``django.migrations``, kept in the top-level
``migrations/`` folder).

Each integration may import the outbox core and ``broker_embedded``'s public API; the core
never imports an integration, and ``django`` never imports SQLAlchemy (``.importlinter``).
"""
