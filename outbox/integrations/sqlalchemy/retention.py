"""Retention on a SQLAlchemy engine (the rules: ``outbox.retention``): each batch is a
transaction of its own on a pooled connection, running the core's statements."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Engine

from ...retention import Progress, PurgeOptions, PurgeReport, RetentionPolicy, purge
from ...sql import Execute
from .fence import run, sql_for


def purge_engine(engine: Engine, policy: RetentionPolicy, list_open: Callable[[str | None], Collection[str]],
                 options: PurgeOptions | None = None, progress: Progress | None = None,
                 now: datetime | None = None) -> PurgeReport:
    """Purge the framework tables of ``engine``'s database (see ``outbox.retention.purge``;
    ``list_open`` is the broker's ``open_transactions``)."""

    @contextmanager
    def transaction() -> Iterator[Execute]:
        with engine.begin() as conn:
            yield lambda statement, params: run(conn, statement, params)

    return purge(engine.url.render_as_string(hide_password=True), transaction, sql_for(engine), policy, list_open,
                 options, progress, now)
