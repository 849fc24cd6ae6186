"""Django system checks (``manage.py check``), registered by the app's ``ready()``.

* ``halfmoon_outbox.E001`` .. ``E011``: a wrong ``OUTBOX`` setting (unknown key, broker URL
  that is not ``tcp://`` or ``embedded://``, conflicting broker URL variables, group,
  ``PRODUCER_GROUPS`` shape or alias, lock timeout, ``RETENTION``, ``ANSWER_CHECK_BACKS``,
  ``ONEWAY_END``, ``ON_BROKER_DOWN``); see ``conf``.
* ``halfmoon_outbox.W001`` (``check --database ALIAS``): the app's migrations are not all
  applied on an alias holding an owned group's transaction_log. A warning, as Django's own
  notice is, so ``migrate`` (which runs the database checks first) still runs.
* ``halfmoon_outbox.W002``: a ``tcp://`` broker does not answer within a second. An
  ``embedded://`` broker is opened in-process at first use and is not opened here.
* ``halfmoon_outbox.W003``: a SQLite database holding an owned group's transaction_log
  without ``OPTIONS["transaction_mode"] = "IMMEDIATE"`` (Django 5.1+): a deferred
  transaction takes the write lock only at its first write, so the producer and the fence
  can each wait on the other's lock and fail with "database is locked".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from broker_embedded import BrokerClient, BrokerError

from .conf import outbox_settings, settings_errors

APP_LABEL = "halfmoon_outbox"
BROKER_TIMEOUT_S = 1.0


def _ours(app_configs: Sequence[AppConfig] | None) -> bool:
    return app_configs is None or any(config.label == APP_LABEL for config in app_configs)


def check_settings(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """Each wrong ``OUTBOX`` setting as an Error."""
    if not _ours(app_configs):
        return []
    return [Error(str(exc), hint="see docs/django.md, Settings", id=f"{APP_LABEL}.{exc.check_id}")
            for exc in settings_errors()]


def check_migrations(app_configs: Sequence[AppConfig] | None, databases: Iterable[str] | None = None,
                     **kwargs: Any) -> list[CheckMessage]:
    """A Warning per checked alias (of an owned group) with unapplied outbox migrations."""
    if not _ours(app_configs) or not databases or settings_errors():
        return []
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    conf = outbox_settings()
    found: list[CheckMessage] = []
    for alias in sorted(set(databases) & set(conf.owned_aliases)):
        executor = MigrationExecutor(connections[alias])
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
        unapplied = [migration.name for migration, _ in executor.migration_plan(targets)]
        if unapplied:
            found.append(Warning(
                f"database {alias!r} lacks the outbox migrations {unapplied}: a transactional message sent "
                "there fails until they are applied (manage.py migrate, which prints this before it applies "
                "them)", hint=f"manage.py migrate {APP_LABEL} --database {alias}",
                id=f"{APP_LABEL}.W001",
            ))
    return found


def check_broker(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """A Warning if a ``tcp://`` broker does not answer within ``BROKER_TIMEOUT_S``."""
    if not _ours(app_configs) or settings_errors():
        return []
    url = outbox_settings().broker_url
    if not url.startswith("tcp://"):
        return []
    client = BrokerClient(url, timeout_s=BROKER_TIMEOUT_S, connect_timeout_s=BROKER_TIMEOUT_S)
    try:
        client.list_topics()
    except BrokerError as exc:
        return [Warning(f"the broker at {url} does not answer: {exc}",
                        hint="start it (halfmoon-broker serve) or fix OUTBOX['BROKER_URL'] / HALFMOON_BROKER_URL",
                        id=f"{APP_LABEL}.W002")]
    finally:
        client.close()
    return []


#: SQLite transaction modes that take the write lock at BEGIN.
LOCKING_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})


def check_sqlite_transaction_mode(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """A Warning per SQLite alias of an owned group whose transactions begin DEFERRED."""
    if not _ours(app_configs) or settings_errors():
        return []
    from django.db import connections

    conf = outbox_settings()
    found: list[CheckMessage] = []
    for alias in conf.owned_aliases:
        database = connections[alias].settings_dict
        mode = str((database.get("OPTIONS") or {}).get("transaction_mode") or "DEFERRED").upper()
        if database["ENGINE"].endswith("sqlite3") and mode not in LOCKING_MODES:
            found.append(Warning(
                f"SQLite database {alias!r} begins its transactions {mode}: the outbox's producer and its "
                "check-back fence can each wait on the other's lock and fail with 'database is locked'",
                hint=f'add "OPTIONS": {{"transaction_mode": "IMMEDIATE", "timeout": 20}} to DATABASES[{alias!r}] '
                     "(Django 5.1+); see docs/django.md",
                id=f"{APP_LABEL}.W003",
            ))
    return found


def register_checks() -> None:
    """Register the checks (called from ``AppConfig.ready``)."""
    register(check_settings, APP_LABEL)
    register(check_migrations, APP_LABEL, Tags.database)
    register(check_broker, APP_LABEL)
    register(check_sqlite_transaction_mode, APP_LABEL)
