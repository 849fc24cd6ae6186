"""Drop the ``varchar_pattern_ops`` index PostgreSQL got for ``transaction_id``.

Django adds one to every CharField primary key on PostgreSQL for ``LIKE 'prefix%'``
lookups. Nothing looks transaction ids up that way, every producer transaction would
keep it up to date, and the tables Alembic creates do not have it: without it both
create the same schema. No other database gets such an index.
"""

from django.db import migrations


def _like_index(schema_editor, apps):
    model = apps.get_model("halfmoon_outbox", "TransactionLog")
    field = model._meta.get_field("transaction_id")
    name = schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="_like")
    return model, field, name


def drop_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _, _, name = _like_index(schema_editor, apps)
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def create_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        model, field, _ = _like_index(schema_editor, apps)
        schema_editor.execute(schema_editor._create_like_index_sql(model, field))


class Migration(migrations.Migration):

    dependencies = [
        ("halfmoon_outbox", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(drop_like_index, create_like_index, elidable=False),
    ]
