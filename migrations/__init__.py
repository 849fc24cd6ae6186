"""The framework tables' migration histories, kept at the top of the checkout.

``alembic/`` installs as ``outbox.integrations.alembic`` and ``django/`` as
``outbox.integrations.django.migrations`` (``[tool.setuptools.package-dir]`` in
pyproject.toml). This file is not shipped: it makes the folder a package in the checkout so
that type checkers and linters read ``migrations/alembic`` and ``migrations/django`` as
``migrations.alembic`` and ``migrations.django``, not as the ``alembic`` and ``django``
libraries.
"""
