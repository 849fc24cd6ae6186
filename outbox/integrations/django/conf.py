"""``settings.OUTBOX``: the app's settings, with defaults.

    OUTBOX = {
        "BROKER_URL": "tcp://127.0.0.1:9876",    # or "embedded:///path/to/dir"
        "PRODUCER_GROUP": "default",
        "PRODUCER_GROUPS": {"billing": "billing_db"},   # or ["billing"]: more groups owned here
        "CHECK_LOCK_TIMEOUT_MS": 2000,
        "RETENTION": {"DEDUP_WINDOW_S": 7 * 86400},   # manage.py outbox_purge, docs/retention.md
        "ANSWER_CHECK_BACKS": True,   # this project's producer answers its group's check-backs
        "ONEWAY_END": True,   # END_TRANSACTION after the commit is not waited for (False: it is)
        "ON_BROKER_DOWN": "raise",   # or "store": calls commit with their messages in the database
    }

The broker URL: ``OUTBOX["BROKER_URL"]`` if given, else ``HALFMOON_BROKER_URL``, else
``OUTBOX_BROKER_URL`` (both set and different is an error), else ``tcp://127.0.0.1:9876``.

This project owns the transaction_log of ``PRODUCER_GROUP`` and of every group of
``PRODUCER_GROUPS`` (a list, or a mapping group -> ``DATABASES`` alias); only those groups'
transactions are checked or resolved here, each on its alias (an unmapped group: the alias
the router picks for writing ``TransactionLog``). Other groups on the same broker belong to
other services: fencing their ids in this database would answer ROLLBACK for transactions
that committed elsewhere.

Each wrong setting is an ``OutboxSettingError`` whose ``check_id`` is the system check
reporting it (``manage.py check``). Changing ``OUTBOX`` at run time (``override_settings``
in tests) closes the producer; the next use connects to the new broker.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ...errors import ConfigurationError, OutboxError
from ...producer import Producer
from ...retention import RetentionPolicy
from ...schema import DEFAULT_LOCK_TIMEOUT_MS
from ...settings import (
    DEFAULT_BROKER_URL,
    ConflictingBrokerUrlsError,
    broker_url_from_env,
    validated_broker_url,
)
from ...stored import ON_BROKER_DOWN_CHOICES, OnBrokerDown, checked_mode

KEYS = frozenset({"BROKER_URL", "PRODUCER_GROUP", "PRODUCER_GROUPS", "CHECK_LOCK_TIMEOUT_MS", "RETENTION",
                  "ANSWER_CHECK_BACKS", "ONEWAY_END", "ON_BROKER_DOWN"})
#: ``OUTBOX["RETENTION"]`` keys -> ``RetentionPolicy`` fields.
RETENTION_KEYS = {
    "TRANSACTION_TIMEOUT_S": "transaction_timeout_s",
    "CHECK_INTERVAL_S": "check_interval_s",
    "CHECK_MAX": "check_max",
    "MARGIN_S": "margin_s",
    "DEDUP_WINDOW_S": "dedup_window_s",
}


class OutboxSettingError(ImproperlyConfigured):
    """One wrong ``OUTBOX`` setting; ``check_id`` is the system check that reports it."""

    def __init__(self, check_id: str, message: str) -> None:
        super().__init__(message)
        self.check_id = check_id


class ForeignGroupError(OutboxError):
    """A transaction of a producer group whose transaction_log this project does not own:
    its own service checks and resolves it."""


@dataclass(frozen=True)
class DjangoOutboxSettings:
    broker_url: str
    producer_group: str
    check_lock_timeout_ms: int
    #: every owned group -> its ``DATABASES`` alias (None: the router's choice)
    group_databases: Mapping[str, str | None]
    #: how long ``manage.py outbox_purge`` keeps the framework tables' rows
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    #: whether this project's producer answers its group's check-backs (False: only the Celery worker's task)
    answer_check_backs: bool = True
    #: whether the producer's END_TRANSACTION after a commit is written without waiting (``Producer.oneway_end``)
    oneway_end: bool = True
    #: what a call does when the broker cannot take its half message (``Producer.on_broker_down``)
    on_broker_down: OnBrokerDown = "raise"

    @property
    def owned_groups(self) -> frozenset[str]:
        """The producer groups whose transaction_log lives in this project's databases."""
        return frozenset(self.group_databases)

    @property
    def owned_aliases(self) -> list[str]:
        """The ``DATABASES`` aliases holding an owned group's tables, sorted."""
        return sorted({self.database_for(group) for group in self.owned_groups})

    def database_for(self, producer_group: str) -> str:
        """The alias holding ``producer_group``'s transaction_log; ``ForeignGroupError``
        for a group this project does not own."""
        if producer_group not in self.group_databases:
            raise ForeignGroupError(
                f"producer group {producer_group!r} is owned by another service (this project owns "
                f"{sorted(self.owned_groups)}; see OUTBOX['PRODUCER_GROUPS'])"
            )
        alias = self.group_databases[producer_group]
        if alias is None:
            from django.db import router

            from .models import TransactionLog

            alias = router.db_for_write(TransactionLog)
        return alias


def _broker_url(raw: Mapping[str, Any]) -> str:
    try:
        if "BROKER_URL" in raw:
            return validated_broker_url(raw["BROKER_URL"], "OUTBOX['BROKER_URL']")
        return broker_url_from_env() or DEFAULT_BROKER_URL
    except ConflictingBrokerUrlsError as exc:
        raise OutboxSettingError("E003", str(exc)) from None
    except ConfigurationError as exc:
        raise OutboxSettingError("E002", str(exc)) from None


def _producer_group(raw: Mapping[str, Any]) -> str:
    group = raw.get("PRODUCER_GROUP", "default")
    if not isinstance(group, str) or not group:
        raise OutboxSettingError("E004", "OUTBOX['PRODUCER_GROUP'] must be a non-empty string")
    return group


def _other_groups(raw: Mapping[str, Any]) -> dict[str, str | None]:
    groups = raw.get("PRODUCER_GROUPS", ())
    shape = "OUTBOX['PRODUCER_GROUPS'] must be a list of group names or a mapping group -> DATABASES alias"
    if isinstance(groups, list | tuple):
        if not all(isinstance(group, str) for group in groups):
            raise OutboxSettingError("E005", f"{shape}, not {groups!r}")
        groups = dict.fromkeys(groups)
    if not isinstance(groups, Mapping):
        raise OutboxSettingError("E005", shape)
    for group, alias in groups.items():
        if not isinstance(group, str) or not group or not (alias is None or isinstance(alias, str)):
            raise OutboxSettingError("E005", f"{shape}, not {group!r}: {alias!r}")
        if alias is not None and alias not in settings.DATABASES:
            raise OutboxSettingError(
                "E006", f"OUTBOX['PRODUCER_GROUPS'] maps {group!r} to {alias!r}, which is not in DATABASES"
            )
    return dict(groups)


def _check_lock_timeout_ms(raw: Mapping[str, Any]) -> int:
    timeout = raw.get("CHECK_LOCK_TIMEOUT_MS", DEFAULT_LOCK_TIMEOUT_MS)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise OutboxSettingError("E007", "OUTBOX['CHECK_LOCK_TIMEOUT_MS'] must be a positive integer")
    return timeout


def _retention(raw: Mapping[str, Any]) -> RetentionPolicy:
    given = raw.get("RETENTION", {})
    if not isinstance(given, Mapping) or set(given) - set(RETENTION_KEYS):
        raise OutboxSettingError("E008", f"OUTBOX['RETENTION'] must be a dict with keys among {sorted(RETENTION_KEYS)}")
    try:
        return RetentionPolicy(**{RETENTION_KEYS[key]: value for key, value in given.items()})
    except ConfigurationError as exc:
        raise OutboxSettingError("E008", f"OUTBOX['RETENTION']: {exc}") from None


def _flag(key: str, check_id: str) -> Callable[[Mapping[str, Any]], bool]:
    """The reader of the True/False setting ``key`` (default True)."""

    def read(raw: Mapping[str, Any]) -> bool:
        value = raw.get(key, True)
        if not isinstance(value, bool):
            raise OutboxSettingError(check_id, f"OUTBOX[{key!r}] must be True or False")
        return value

    return read


def _on_broker_down(raw: Mapping[str, Any]) -> OnBrokerDown:
    value = raw.get("ON_BROKER_DOWN", "raise")
    try:
        return checked_mode(value)
    except ConfigurationError:
        raise OutboxSettingError("E011", f"OUTBOX['ON_BROKER_DOWN'] must be one of {ON_BROKER_DOWN_CHOICES}, "
                                         f"not {value!r}") from None


_READERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "broker_url": _broker_url,
    "producer_group": _producer_group,
    "group_databases": _other_groups,
    "check_lock_timeout_ms": _check_lock_timeout_ms,
    "retention": _retention,
    "answer_check_backs": _flag("ANSWER_CHECK_BACKS", "E009"),
    "oneway_end": _flag("ONEWAY_END", "E010"),
    "on_broker_down": _on_broker_down,
}


def _read() -> tuple[dict[str, Any], list[OutboxSettingError]]:
    """Every setting's value, and every wrong setting's error."""
    raw = getattr(settings, "OUTBOX", {})
    if not isinstance(raw, Mapping):
        return {}, [OutboxSettingError("E001", "settings.OUTBOX must be a dict")]
    errors = []
    if unknown := set(raw) - KEYS:
        errors.append(OutboxSettingError("E001", f"unknown OUTBOX settings: {sorted(unknown)} "
                                                 f"(known: {sorted(KEYS)})"))
    values = {}
    for name, read in _READERS.items():
        try:
            values[name] = read(raw)
        except OutboxSettingError as exc:
            errors.append(exc)
    return values, errors


def settings_errors() -> list[OutboxSettingError]:
    """Every wrong ``OUTBOX`` setting (empty when all are right)."""
    return _read()[1]


def outbox_settings() -> DjangoOutboxSettings:
    """``settings.OUTBOX`` checked and completed with defaults (the first wrong setting
    raises its ``OutboxSettingError``)."""
    values, errors = _read()
    if errors:
        raise errors[0]
    owned = {**values["group_databases"]}
    owned.setdefault(values["producer_group"], None)
    return DjangoOutboxSettings(values["broker_url"], values["producer_group"], values["check_lock_timeout_ms"],
                                owned, values["retention"], values["answer_check_backs"], values["oneway_end"],
                                values["on_broker_down"])


log = logging.getLogger(__name__)

_building = threading.Lock()


@functools.cache
def _producer() -> Producer:
    conf = outbox_settings()
    built = Producer(conf.broker_url, conf.producer_group, oneway_end=conf.oneway_end,
                     on_broker_down=conf.on_broker_down)
    if conf.answer_check_backs:
        from django.db import DatabaseError

        from .recorder import fence_on_group_database

        built.answer_check_backs(fence_on_group_database, database_errors=(DatabaseError,))
    return built


def producer() -> Producer:
    """This process's producer for ``OUTBOX['PRODUCER_GROUP']``. While it runs it answers
    the group's check-backs with the fence on the group's alias (the broker asks a connected
    producer of the group first; the Celery worker is for when none is alive), unless
    ``OUTBOX['ANSWER_CHECK_BACKS']`` is False."""
    with _building:
        return _producer()


def start_answering_check_backs() -> None:
    """Build the producer in the background when the broker is a server (``tcp://``,
    ``rocketmq5://``), so a restarted process answers its group's check-backs before its
    first transactional call; a broker that does not answer yet delays nothing."""
    try:
        conf = outbox_settings()
    except OutboxError:
        return  # reported by the system checks
    if conf.answer_check_backs and not conf.broker_url.startswith("embedded:"):  # an embedded broker lives in the producer: built on first use
        threading.Thread(target=_start_producer, name="outbox-producer", daemon=True).start()


def _start_producer() -> None:
    try:
        producer()
    except Exception:  # a background start must not kill the process; the first call raises it again
        log.exception("the outbox producer could not be built")


def reset_producer(*, setting: str, **_: Any) -> None:
    """``setting_changed`` receiver: close the producer when ``OUTBOX`` changes."""
    with _building:
        if setting != "OUTBOX" or _producer.cache_info().currsize == 0:
            return
        _producer().close()
        _producer.cache_clear()
