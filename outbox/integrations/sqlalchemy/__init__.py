"""The SQLAlchemy flavour: ``tables`` (the framework tables), ``engine`` (SQLite's
``BEGIN IMMEDIATE``), ``session`` (``install``/``send``), ``decorator``
(``@transactional_message``), ``recorder`` (the transaction log: ``record_committed``,
``check_transaction``, ``record_consumed``), ``check_back`` (producers answering their
group's check-backs), ``tasks`` (the Celery tasks) and ``consumer`` (``@idempotent_consumer``); the public names are also ``outbox.*``.

May import the outbox core, the Celery integration's ORM-free tasks and SQLAlchemy; never
Django.
"""
