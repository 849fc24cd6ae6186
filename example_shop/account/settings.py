"""Django settings of the account service; everything comes from the environment.

``SHOP_ACCOUNT_DATABASE_URL`` (SQLAlchemy URL, default a SQLite file in ``SHOP_WORK_DIR``),
``OUTBOX_BROKER_URL`` (the broker), ``SHOP_PRODUCER_GROUP``.
"""

from __future__ import annotations

import os
from pathlib import Path

from example_shop.dburl import django_database

WORK_DIR = Path(os.environ.get("SHOP_WORK_DIR", "demo-work")).resolve()
DATABASE_URL = os.environ.get(
    "SHOP_ACCOUNT_DATABASE_URL", f"sqlite:///{WORK_DIR / 'account.sqlite3'}"
)

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-shop-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox.integrations.django",
    "example_shop.account",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_shop.account.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": django_database(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

OUTBOX = {
    "BROKER_URL": os.environ.get("OUTBOX_BROKER_URL", f"embedded://{WORK_DIR / 'broker'}"),
    "PRODUCER_GROUP": os.environ.get("SHOP_PRODUCER_GROUP", "account-service"),
    # Orders keep succeeding while the broker is down: their messages wait in this database
    # until the relay (``python -m example_shop.account relay``) hands them over.
    "ON_BROKER_DOWN": os.environ.get("SHOP_ON_BROKER_DOWN", "store"),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
