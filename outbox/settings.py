"""Settings from the environment, with defaults that need nothing installed.

| variable | default | meaning |
| --- | --- | --- |
| ``HALFMOON_BROKER_URL`` | ``tcp://127.0.0.1:9876`` | the broker (``tcp://``, ``rocketmq5://`` or ``embedded://``) |
| ``OUTBOX_BROKER_URL`` | | older name of ``HALFMOON_BROKER_URL`` (an error if both differ) |
| ``OUTBOX_DATABASE_URL`` | ``sqlite:///DATA_HOME/outbox.sqlite3`` | the database with transaction_log |
| ``OUTBOX_GROUP_DATABASES`` | ``{}`` | JSON map producer group -> database URL, for the checker |
| ``OUTBOX_CELERY_BROKER_URL`` | ``filesystem://`` | Celery transport (``redis://...`` in production) |
| ``OUTBOX_CELERY_DATA_DIR`` | ``DATA_HOME/celery`` | folder of the server-less filesystem transport |
| ``OUTBOX_CHECK_LOCK_TIMEOUT_MS`` | ``2000`` | how long a check waits on a running transaction |
| ``OUTBOX_CHECK_CONNECT_TIMEOUT_S`` | ``5`` | a check's PostgreSQL connection attempt gives up after this |
| ``OUTBOX_CHECK_STATEMENT_TIMEOUT_MS`` | ``5000`` | each statement of a check (PostgreSQL) gives up after this |
| ``OUTBOX_BROKER_TRANSACTION_TIMEOUT_S`` | ``6`` | the broker's ``--transaction-timeout`` (retention's horizon) |
| ``OUTBOX_BROKER_CHECK_INTERVAL_S`` | ``5`` | the broker's ``--check-interval`` (retention's horizon) |
| ``OUTBOX_BROKER_CHECK_MAX`` | ``15`` | the broker's ``--check-max`` (retention's horizon) |
| ``OUTBOX_RETENTION_MARGIN_S`` | ``604800`` | transaction_log rows are kept this long past the broker's horizon |
| ``OUTBOX_DEDUP_WINDOW_S`` | ``604800`` | consumed_message rows are kept this long (docs/retention.md) |
| ``OUTBOX_RELAY`` | ``1`` if ``OUTBOX_DATABASE_URL`` is set, else ``0`` | whether the Celery check-back worker runs the relay |

``DATA_HOME`` is ``$XDG_DATA_HOME/halfmoon``, or ``~/.local/share/halfmoon`` (``data_home()``):
one folder per user, whatever the working directory, so a producer, a broker's Celery checker
and a Celery worker of one user started from different folders meet in the same queue and
database. A bad value is a ``ConfigurationError`` that names its variable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from broker_embedded.api import DEFAULT_PORT

from .errors import ConfigurationError
from .retention import RetentionPolicy
from .schema import DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS

DEFAULT_BROKER_URL = f"tcp://127.0.0.1:{DEFAULT_PORT}"
#: The broker URL's environment variables, the first one winning; both set and different
#: is a ``ConfigurationError`` (a producer and its checker on two brokers never meet).
BROKER_URL_VARIABLES = ("HALFMOON_BROKER_URL", "OUTBOX_BROKER_URL")


class ConflictingBrokerUrlsError(ConfigurationError):
    """``HALFMOON_BROKER_URL`` and ``OUTBOX_BROKER_URL`` are both set, to different URLs."""


def validated_broker_url(url: object, where: str) -> str:
    """``url`` if it is ``tcp://host:port``, ``rocketmq5://host:port`` or ``embedded://path``; ``ConfigurationError``
    naming ``where`` it came from otherwise."""
    parsed = urlparse(url) if isinstance(url, str) else None
    if parsed is None or not (
        (parsed.scheme in ("tcp", "rocketmq5") and parsed.hostname and _has_port(parsed.netloc))
        or (parsed.scheme == "embedded" and (parsed.netloc or parsed.path))
    ):
        raise ConfigurationError(f"{where} must be a tcp://host:port, rocketmq5://host:port or embedded:///path URL, not {url!r}")
    return str(url)


def _has_port(netloc: str) -> bool:
    port = netloc.rpartition(":")[2]
    return port.isdigit() and 0 < int(port) < 65536


def broker_url_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The broker URL of ``HALFMOON_BROKER_URL`` or its older name ``OUTBOX_BROKER_URL``
    (unset or empty: None); ``ConfigurationError`` if both are set and differ, or for a
    URL that is not ``tcp://``, ``rocketmq5://`` or ``embedded://``."""
    env = os.environ if env is None else env
    given = {name: env[name] for name in BROKER_URL_VARIABLES if env.get(name)}
    if len(set(given.values())) > 1:
        raise ConflictingBrokerUrlsError(
            "HALFMOON_BROKER_URL and OUTBOX_BROKER_URL name different brokers "
            f"({given['HALFMOON_BROKER_URL']!r}, {given['OUTBOX_BROKER_URL']!r}): set one of them"
        )
    if not given:
        return None
    name, url = next(iter(given.items()))  # HALFMOON_BROKER_URL first
    return validated_broker_url(url, name)


def data_home(env: Mapping[str, str] | None = None) -> Path:
    """The per-user folder of the defaults: ``$XDG_DATA_HOME/halfmoon`` (when absolute, as
    the XDG spec asks), else ``~/.local/share/halfmoon``; never the working directory."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "halfmoon"


def default_database_url(env: Mapping[str, str] | None = None) -> str:
    """``OUTBOX_DATABASE_URL``'s default: SQLite in ``data_home()``."""
    return f"sqlite:///{data_home(env) / 'outbox.sqlite3'}"


#: Number settings: field, environment variable, type, and whether 0 is allowed.
CHECK_VARIABLES: tuple[tuple[str, str, type, bool], ...] = (
    ("check_lock_timeout_ms", "OUTBOX_CHECK_LOCK_TIMEOUT_MS", int, True),
    ("check_connect_timeout_s", "OUTBOX_CHECK_CONNECT_TIMEOUT_S", int, False),
    ("check_statement_timeout_ms", "OUTBOX_CHECK_STATEMENT_TIMEOUT_MS", int, False),
)
#: ``RetentionPolicy`` fields, their environment variables and types.
RETENTION_VARIABLES: tuple[tuple[str, str, type], ...] = (
    ("transaction_timeout_s", "OUTBOX_BROKER_TRANSACTION_TIMEOUT_S", float),
    ("check_interval_s", "OUTBOX_BROKER_CHECK_INTERVAL_S", float),
    ("check_max", "OUTBOX_BROKER_CHECK_MAX", int),
    ("margin_s", "OUTBOX_RETENTION_MARGIN_S", float),
    ("dedup_window_s", "OUTBOX_DEDUP_WINDOW_S", float),
)


def _number(env: Mapping[str, str], variable: str, kind: type, default: float, zero_ok: bool = True) -> float:
    """``variable``'s value as ``kind`` (``default`` when unset); ``ConfigurationError``
    naming the variable for anything but a number >= 0 (> 0 unless ``zero_ok``)."""
    text = env.get(variable)
    if text is None:
        return default
    least = "a number >= 0" if zero_ok else "a number > 0"
    what = f"a whole {least[2:]}" if kind is int else least
    try:
        value = kind(text)
    except ValueError:
        raise ConfigurationError(f"bad outbox setting {variable}={text!r}: must be {what}") from None
    if not (value >= 0 if zero_ok else value > 0):
        raise ConfigurationError(f"bad outbox setting {variable}={text!r}: must be {what}")
    return value  # type: ignore[no-any-return]


def _flag(env: Mapping[str, str], variable: str, default: bool) -> bool:
    """``variable`` as a yes/no (``1``/``0``, ``true``/``false``, ``yes``/``no``; unset:
    ``default``); ``ConfigurationError`` naming it otherwise."""
    text = env.get(variable, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"bad outbox setting {variable}={env[variable]!r}: must be 1 or 0")


def _group_databases(env: Mapping[str, str]) -> dict[str, str]:
    text = env.get("OUTBOX_GROUP_DATABASES", "{}")
    try:
        groups = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"bad outbox setting OUTBOX_GROUP_DATABASES={text!r}: not JSON ({exc})") from None
    if not isinstance(groups, dict):
        raise ConfigurationError(f"bad outbox setting OUTBOX_GROUP_DATABASES={text!r}: must be a JSON object "
                                 '(producer group -> database URL, e.g. {"shop": "postgresql+psycopg://..."})')
    return {str(k): str(v) for k, v in groups.items()}


@dataclass(frozen=True)
class OutboxSettings:
    """The framework's settings; ``from_env()`` reads them from the environment."""

    broker_url: str = DEFAULT_BROKER_URL
    database_url: str = field(default_factory=default_database_url)
    group_databases: dict[str, str] = field(default_factory=dict)
    celery_broker_url: str = "filesystem://"
    celery_data_dir: Path = field(default_factory=lambda: data_home() / "celery")
    check_lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    check_connect_timeout_s: int = 5
    check_statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    #: How long ``outbox purge`` keeps the framework tables' rows.
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    #: Whether the standalone Celery worker relays stored messages (``outbox.relay``).
    relay: bool = False

    def __post_init__(self) -> None:
        if self.check_connect_timeout_s <= 0 or self.check_statement_timeout_ms <= 0:
            raise ConfigurationError("the check's connect and statement timeouts must be positive")

    @classmethod
    def from_env(cls, **overrides: object) -> OutboxSettings:
        """Settings from the environment variables; keyword ``overrides`` win over them.
        ``ConfigurationError`` naming the variable for a bad value."""
        env = os.environ
        checks = {name: _number(env, variable, kind, getattr(cls, name), zero_ok)
                  for name, variable, kind, zero_ok in CHECK_VARIABLES}
        retention = RetentionPolicy(**{name: _number(env, variable, kind, getattr(RetentionPolicy, name))
                                       for name, variable, kind in RETENTION_VARIABLES})  # type: ignore[arg-type]
        data_dir = env.get("OUTBOX_CELERY_DATA_DIR")
        settings = cls(
            broker_url=broker_url_from_env(env) or cls.broker_url,
            database_url=env.get("OUTBOX_DATABASE_URL") or default_database_url(env),
            group_databases=_group_databases(env),
            celery_broker_url=env.get("OUTBOX_CELERY_BROKER_URL", cls.celery_broker_url),
            celery_data_dir=Path(data_dir) if data_dir else data_home(env) / "celery",
            retention=retention,
            relay=_flag(env, "OUTBOX_RELAY", default=bool(env.get("OUTBOX_DATABASE_URL"))),
            **checks,  # type: ignore[arg-type]
        )
        return dataclasses.replace(settings, **overrides)  # type: ignore[arg-type]

    def database_for(self, producer_group: str) -> str:
        """The database URL holding ``producer_group``'s transaction_log."""
        return self.group_databases.get(producer_group, self.database_url)

    @property
    def databases(self) -> list[str]:
        """Every database URL of the settings, once: ``database_url``, then the groups'."""
        return list(dict.fromkeys([self.database_url, *self.group_databases.values()]))
