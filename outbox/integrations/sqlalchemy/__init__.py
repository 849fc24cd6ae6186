"""The SQLAlchemy flavour: ``tables`` (the framework tables), ``engine`` (SQLite's
``BEGIN IMMEDIATE``), ``session`` (``install``/``send``), ``decorator``
(``@transactional_message``), ``fence`` (``record_committed``, ``check_transaction``) and
``consumer`` (``@idempotent_consumer``); the public names are also ``outbox.*``."""
