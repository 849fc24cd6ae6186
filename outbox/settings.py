"""Settings from the environment, with defaults that need nothing installed.

| variable | default | meaning |
| --- | --- | --- |
| ``OUTBOX_BROKER_URL`` | ``tcp://127.0.0.1:9876`` | the broker (``tcp://`` or ``embedded://``) |
| ``OUTBOX_DATABASE_URL`` | ``sqlite:///outbox.sqlite3`` | the database with transaction_log |
| ``OUTBOX_GROUP_DATABASES`` | ``{}`` | JSON map producer group -> database URL, for the checker |
| ``OUTBOX_CELERY_BROKER_URL`` | ``filesystem://`` | Celery transport (``redis://...`` in production) |
| ``OUTBOX_CELERY_DATA_DIR`` | ``.halfmoon/celery`` | folder of the server-less filesystem transport |
| ``OUTBOX_CHECK_LOCK_TIMEOUT_MS`` | ``2000`` | how long a check waits on a running transaction |
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigurationError


@dataclass(frozen=True)
class OutboxSettings:
    """The framework's settings; ``from_env()`` reads them from the environment."""

    broker_url: str = "tcp://127.0.0.1:9876"
    database_url: str = "sqlite:///outbox.sqlite3"
    group_databases: dict[str, str] = field(default_factory=dict)
    celery_broker_url: str = "filesystem://"
    celery_data_dir: Path = Path(".halfmoon/celery")
    check_lock_timeout_ms: int = 2000

    @classmethod
    def from_env(cls, **overrides: object) -> OutboxSettings:
        """Settings from ``OUTBOX_*`` variables; keyword ``overrides`` win over both."""
        env = os.environ
        try:
            groups = json.loads(env.get("OUTBOX_GROUP_DATABASES", "{}"))
            timeout = int(env.get("OUTBOX_CHECK_LOCK_TIMEOUT_MS", "2000"))
        except ValueError as exc:
            raise ConfigurationError(f"bad outbox setting: {exc}") from None
        if not isinstance(groups, dict):
            raise ConfigurationError("OUTBOX_GROUP_DATABASES must be a JSON object")
        settings = cls(
            broker_url=env.get("OUTBOX_BROKER_URL", cls.broker_url),
            database_url=env.get("OUTBOX_DATABASE_URL", cls.database_url),
            group_databases={str(k): str(v) for k, v in groups.items()},
            celery_broker_url=env.get("OUTBOX_CELERY_BROKER_URL", cls.celery_broker_url),
            celery_data_dir=Path(env.get("OUTBOX_CELERY_DATA_DIR", str(cls.celery_data_dir))),
            check_lock_timeout_ms=timeout,
        )
        return dataclasses.replace(settings, **overrides)  # type: ignore[arg-type]

    def database_for(self, producer_group: str) -> str:
        """The database URL holding ``producer_group``'s transaction_log."""
        return self.group_databases.get(producer_group, self.database_url)
