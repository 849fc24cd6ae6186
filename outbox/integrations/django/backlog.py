"""The stored messages waiting for the relay (store mode, ``outbox.stored``): how many per
producer group, and how old the oldest is, by the database's clock. Shown by
``manage.py outbox_relay --status`` and the admin's pending page."""

from __future__ import annotations

from dataclasses import dataclass

from .conf import outbox_settings
from .recorder import RECORDER


@dataclass(frozen=True)
class StoredBacklog:
    """One producer group's unrelayed stored messages on one ``DATABASES`` alias."""

    using: str
    producer_group: str
    waiting: int
    #: how long ago the oldest of them was stored
    oldest_age_s: float

    def __str__(self) -> str:
        return f"{self.using}\t{self.producer_group}\t{self.waiting} waiting, the oldest {self.oldest_age_s:.0f}s old"


def stored_backlog(using: str) -> list[StoredBacklog]:
    """The backlog of every producer group with stored messages waiting on ``using``."""
    execute, sql = RECORDER.statements(using)
    ((now,),) = execute(sql.read_now, ())
    return [StoredBacklog(using, str(group), int(count), (sql.database_time(now) - sql.database_time(oldest))
                          .total_seconds())
            for group, count, oldest in execute(sql.stored_backlog, ())]


def project_backlog() -> list[StoredBacklog]:
    """``stored_backlog`` of every alias holding an owned group's tables, of the owned groups."""
    conf = outbox_settings()
    return [backlog for alias in conf.owned_aliases for backlog in stored_backlog(alias)
            if backlog.producer_group in conf.owned_groups]
