"""Retention on a SQLAlchemy engine (the rules: ``outbox.retention``): each batch is a
transaction of its own on a pooled connection, running the core's statements."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from ...retention import Progress, PurgeOptions, PurgeReport, RetentionPolicy, purge
from ...sql import Execute
from .engine import create_engine
from .recorder import run, sql_for


def purge_engine(engine: Engine, policy: RetentionPolicy, list_open: Callable[[str | None], Collection[str]],
                 options: PurgeOptions | None = None, progress: Progress | None = None) -> PurgeReport:
    """Purge the framework tables of ``engine``'s database (see ``outbox.retention.purge``;
    ``list_open`` is the broker's ``open_transactions``)."""

    @contextmanager
    def transaction() -> Iterator[Execute]:
        with engine.begin() as conn:
            yield lambda statement, params: run(conn, statement, params)

    return purge(engine.url.render_as_string(hide_password=True), transaction, sql_for(engine), policy, list_open,
                 options, progress)


def purge_databases(urls: Iterable[str], policy: RetentionPolicy, list_open: Callable[[str | None], Collection[str]],
                    options: PurgeOptions | None = None, progress: Progress | None = None,
                    on_report: Callable[[PurgeReport], object] | None = None) -> list[PurgeReport]:
    """``purge_engine`` on each database URL in turn (an engine of its own, disposed
    after); ``on_report`` is told each database's report as it is done."""
    reports = []
    for url in urls:
        engine = create_engine(url)
        try:
            reports.append(purge_engine(engine, policy, list_open, options, progress))
        finally:
            engine.dispose()
        if on_report is not None:
            on_report(reports[-1])
    return reports
