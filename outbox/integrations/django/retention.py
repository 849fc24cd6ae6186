"""Retention from Django (the rules: ``outbox.retention``): each batch is a transaction of
its own (``transaction.atomic``) on the alias's connection, running the core's statements.

A project purges transaction_log and stored_message on the alias of each owned producer
group, only those groups' rows (another service's rows in a shared database are that
service's to purge), and consumed_message on every alias it purges (``default`` included, where
``idempotent_consumer`` writes unless told otherwise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager

from django.db import connections, transaction

from ...retention import Progress, PurgeOptions, PurgeReport, RetentionPolicy, purge
from ...schema import STORED_MESSAGE, TRANSACTION_LOG
from ...sql import Execute
from .conf import outbox_settings, producer
from .recorder import alias_sql, run

#: The tables whose rows belong to a producer group: purged only where an owned group's are.
PER_GROUP = (TRANSACTION_LOG, STORED_MESSAGE)


def purge_alias(using: str, policy: RetentionPolicy, list_open: Callable[[str | None], Collection[str]],
                options: PurgeOptions | None = None, progress: Progress | None = None) -> PurgeReport:
    """Purge the framework tables of the ``DATABASES`` alias ``using`` (see
    ``outbox.retention.purge``; ``list_open`` is the broker's ``open_transactions``)."""
    connection = connections[using]

    @contextmanager
    def batch() -> Iterator[Execute]:
        with transaction.atomic(using=using):
            yield lambda statement, params: run(connection, statement, params)

    return purge(f"database {using!r}", batch, alias_sql(connection), policy, list_open, options, progress)


def _open_transactions(producer_group: str | None) -> list[str]:
    """The broker's open transactions, asked on this process's producer connection (opened
    here if need be, so a broker that is down is a ``BrokerError`` of the purge)."""
    return producer().broker.open_transactions(producer_group)


def purge_project(options: PurgeOptions | None = None, progress: Progress | None = None,
                  aliases: Iterable[str] | None = None,
                  on_report: Callable[[PurgeReport], object] | None = None) -> list[PurgeReport]:
    """Purge every alias of the project (default: ``default`` and the owned groups'), by
    ``OUTBOX["RETENTION"]``, asking this process's producer connection which transactions
    are open; ``on_report`` is told each alias's report as it is done."""
    conf = outbox_settings()
    options = options or PurgeOptions()
    owned: dict[str, list[str]] = {}
    for group in sorted(conf.owned_groups):
        owned.setdefault(conf.database_for(group), []).append(group)
    reports = []
    for alias in sorted(set(aliases or ["default", *owned])):
        groups = owned.get(alias)
        tables = [table for table in options.tables if groups or table not in PER_GROUP]
        if not tables:
            continue
        alias_options = dataclasses.replace(options, tables=tables, producer_groups=groups)
        reports.append(purge_alias(alias, conf.retention, _open_transactions, alias_options, progress))
        if on_report is not None:
            on_report(reports[-1])
    return reports
