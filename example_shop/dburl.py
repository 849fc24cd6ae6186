"""One database URL format for both services: SQLAlchemy URLs, also turned into Django settings."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import make_url


def django_database(url: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for a SQLAlchemy URL (SQLite or PostgreSQL)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parsed.database,
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    if parsed.get_backend_name() == "postgresql":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parsed.database,
            "USER": parsed.username or "postgres",
            "PASSWORD": parsed.password or "",
            "HOST": parsed.host or "127.0.0.1",
            "PORT": str(parsed.port or 5432),
            "CONN_MAX_AGE": 60,
        }
    raise ValueError(f"unsupported database URL for the account service: {url}")
