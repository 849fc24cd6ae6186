"""Indexes on ``created_at`` and ``consumed_at``, what retention deletes by.

``manage.py outbox_purge`` deletes the oldest rows in small batches through them instead
of scanning the tables. On PostgreSQL they are built ``CONCURRENTLY`` (the migration is
not atomic for that), so producers keep writing while a large table is indexed; Alembic's
revision 0003 creates the same indexes.
"""

from django.db import migrations, models

INDEXES = [
    ("transactionlog", models.Index(fields=["created_at"], name="outbox_txlog_created_at_idx")),
    ("consumedmessage", models.Index(fields=["consumed_at"], name="outbox_consumed_at_idx")),
]


def create_indexes(apps, schema_editor):
    concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
    for model_name, index in INDEXES:
        schema_editor.add_index(apps.get_model("halfmoon_outbox", model_name), index, **concurrently)


def drop_indexes(apps, schema_editor):
    concurrently = {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}
    for model_name, index in INDEXES:
        schema_editor.remove_index(apps.get_model("halfmoon_outbox", model_name), index, **concurrently)


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("halfmoon_outbox", "0002_drop_transaction_id_like_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name, index) for model_name, index in INDEXES],
            database_operations=[migrations.RunPython(create_indexes, drop_indexes, elidable=False)],
        ),
    ]
