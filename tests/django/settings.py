"""Settings of the Django test project (SQLite file per run; PostgreSQL as alias ``pg``)."""

import os
import tempfile

BASE = os.environ.get("HALFMOON_DJANGO_TEST_DIR") or tempfile.mkdtemp(prefix="hm-django-")
SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox.integrations.django",
    "tests.django.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.django.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(BASE, "default.sqlite3"),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        "TEST": {"NAME": os.path.join(BASE, "test-default.sqlite3")},
    },
}
if os.environ.get("HALFMOON_DJANGO_PG_NAME"):
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["HALFMOON_DJANGO_PG_NAME"],
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "TEST": {"NAME": os.environ["HALFMOON_DJANGO_PG_NAME"]},
    }
OUTBOX = {"BROKER_URL": f"embedded://{os.path.join(BASE, 'broker')}", "PRODUCER_GROUP": "shop"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
