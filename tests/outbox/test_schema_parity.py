"""Alembic, SQLAlchemy's tables and Django create the same framework tables, column for
column.

Each side creates the tables in a database (SQLite) or schema (PostgreSQL) of its own:
Alembic fresh to head, Alembic at 0001 with rows then upgraded, SQLAlchemy's
``metadata.create_all``, and Django ``migrate``; SQLAlchemy's inspector then describes
each table the same way for all of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, inspect, make_url, text
from sqlalchemy.exc import IntegrityError

from outbox.integrations import alembic as outbox_alembic
from outbox.integrations.sqlalchemy.tables import metadata
from outbox.schema import CONSUMED_MESSAGE, STORED_MESSAGE, TRANSACTION_LOG

ROOT = Path(__file__).resolve().parents[2]
TABLES = (TRANSACTION_LOG, CONSUMED_MESSAGE, STORED_MESSAGE)


@dataclass(frozen=True)
class Side:
    """Where one ORM creates the tables: a SQLAlchemy URL, a schema, a Django database."""

    url: str
    schema: str | None
    django: dict[str, Any]


def _sqlite_side(path: Path) -> Side:
    return Side(f"sqlite:///{path}", None, {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)})


def _postgres_side(url: str, schema: str) -> Side:
    """A schema of its own in the test database, made the search path of every connection."""
    parsed = make_url(url)
    with create_engine(url).begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    options = f"-c search_path={schema}"
    return Side(
        parsed.update_query_dict({"options": options}).render_as_string(hide_password=False),
        schema,
        {"ENGINE": "django.db.backends.postgresql", "NAME": parsed.database, "USER": parsed.username,
         "HOST": parsed.host, "PORT": str(parsed.port), "OPTIONS": {"options": options}},
    )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def sides(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Side]]:
    """Empty places: for Alembic to head, for Alembic 0001 then head, for SQLAlchemy's
    tables, for Django."""
    names = ("alembic", "upgraded", "sqlalchemy", "django")
    if request.param == "sqlite":
        yield {name: _sqlite_side(tmp_path / f"{name}.sqlite3") for name in names}
    else:
        url = request.getfixturevalue("postgres_url")
        yield {name: _postgres_side(url, name) for name in names}


def django_migrate(side: Side) -> None:
    subprocess.run([sys.executable, "-m", "tests.outbox.django_migrate", json.dumps(side.django)],
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=120)


def describe(engine: Engine, table: str, schema: str | None) -> dict[str, Any]:
    """What both ORMs must agree on; columns by name (ALTER TABLE appends, so order differs)."""
    inspector = inspect(engine)
    primary_key = inspector.get_pk_constraint(table, schema)
    columns = {
        column["name"]: {
            "type": column["type"].compile(dialect=engine.dialect),  # family and length
            "nullable": column["nullable"],
            "default": column["default"],
            "identity": column.get("identity"),
            "primary_key": column["name"] in primary_key["constrained_columns"],
        }
        for column in inspector.get_columns(table, schema)
    }
    description = {
        "columns": columns,
        "primary_key": (primary_key["name"], primary_key["constrained_columns"]),
        "unique": sorted((u["name"], u["column_names"]) for u in inspector.get_unique_constraints(table, schema)),
        "indexes": sorted((i["name"], i["column_names"], i["unique"])
                          for i in inspector.get_indexes(table, schema)),
    }
    if engine.dialect.name == "sqlite":  # not reflected: ids never reused, as Django's
        with engine.connect() as conn:
            sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": table}).scalar_one()
        description["autoincrement"] = "AUTOINCREMENT" in sql.upper()
    return description


def describe_all(side: Side, tables: tuple[str, ...] = TABLES) -> dict[str, dict[str, Any]]:
    engine = create_engine(side.url)
    try:
        return {table: describe(engine, table, side.schema) for table in tables}
    finally:
        engine.dispose()


CONSUMED_ROWS = [
    {"consumer_group": "points", "message_id": "m1", "topic": "order.paid", "transaction_id": "tx1"},
    {"consumer_group": "points", "message_id": "m2", "topic": "order.paid", "transaction_id": None},
    {"consumer_group": "mail", "message_id": "m1", "topic": "order.paid", "transaction_id": "tx1"},
]
INSERT_CONSUMED = text(
    f"INSERT INTO {CONSUMED_MESSAGE} (consumer_group, message_id, topic, transaction_id, consumed_at) "
    "VALUES (:consumer_group, :message_id, :topic, :transaction_id, CURRENT_TIMESTAMP)"
)


def test_alembic_and_django_create_the_same_tables(sides: dict[str, Side]) -> None:
    outbox_alembic.upgrade(sides["alembic"].url)
    outbox_alembic.upgrade(sides["upgraded"].url, "0001")
    engine = create_engine(sides["upgraded"].url)
    with engine.begin() as conn:
        conn.execute(INSERT_CONSUMED, CONSUMED_ROWS)
    outbox_alembic.upgrade(sides["upgraded"].url)
    django_migrate(sides["django"])

    django = describe_all(sides["django"])
    assert describe_all(sides["alembic"]) == django
    assert describe_all(sides["upgraded"]) == django
    assert set(django[CONSUMED_MESSAGE]["columns"]) == {
        "id", "consumer_group", "message_id", "topic", "transaction_id", "consumed_at"}

    # the rows kept their data, got ids, and the unique key still refuses a redelivery
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT id, consumer_group, message_id, transaction_id FROM {CONSUMED_MESSAGE} "
                                 "ORDER BY id")).all()
    assert [tuple(row)[1:] for row in rows] == [
        (r["consumer_group"], r["message_id"], r["transaction_id"]) for r in CONSUMED_ROWS]
    assert len({row.id for row in rows}) == 3
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(INSERT_CONSUMED, CONSUMED_ROWS[0])
    with engine.begin() as conn:
        conn.execute(INSERT_CONSUMED, {**CONSUMED_ROWS[0], "message_id": "m3"})
        assert conn.execute(text(f"SELECT max(id) FROM {CONSUMED_MESSAGE}")).scalar_one() > max(r.id for r in rows)
    engine.dispose()


def test_sqlalchemy_tables_and_django_create_the_same_tables(sides: dict[str, Side]) -> None:
    engine = create_engine(sides["sqlalchemy"].url)
    metadata.create_all(engine)
    engine.dispose()
    django_migrate(sides["django"])

    django = describe_all(sides["django"])
    assert describe_all(sides["sqlalchemy"]) == django
    assert set(django[STORED_MESSAGE]["columns"]) == {
        "seq", "message_id", "transaction_id", "producer_group", "topic", "message_group", "message",
        "created_at", "relayed_at"}
    assert {"outbox_stored_relayed_idx", "outbox_stored_group_idx"} <= {
        name for name, _, _ in django[STORED_MESSAGE]["indexes"]}


def test_downgrade_restores_the_composite_key_and_keeps_the_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    outbox_alembic.upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(INSERT_CONSUMED, CONSUMED_ROWS)
    outbox_alembic.downgrade(url, "0001")
    inspector = inspect(engine)
    assert inspector.get_pk_constraint(CONSUMED_MESSAGE)["constrained_columns"] == ["consumer_group", "message_id"]
    assert "id" not in {c["name"] for c in inspector.get_columns(CONSUMED_MESSAGE)}
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {CONSUMED_MESSAGE}")).scalar_one() == 3
    engine.dispose()
