"""``outbox_stored_message``: the messages of calls that committed while the broker was
down (``OUTBOX["ON_BROKER_DOWN"] = "store"``), waiting for the relay. The same table as
``outbox.integrations.sqlalchemy.tables.stored_message`` (tests/outbox/test_schema_parity.py).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('halfmoon_outbox', '0003_retention_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='StoredMessage',
            fields=[
                ('seq', models.BigAutoField(primary_key=True, serialize=False)),
                ('message_id', models.CharField(max_length=64)),
                ('transaction_id', models.CharField(max_length=64)),
                ('producer_group', models.CharField(max_length=128)),
                ('topic', models.CharField(max_length=255)),
                ('message_group', models.CharField(blank=True, max_length=128, null=True)),
                ('message', models.BinaryField()),
                ('created_at', models.DateTimeField()),
                ('relayed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'outbox_stored_message',
                'ordering': ['seq'],
                'indexes': [models.Index(fields=['relayed_at', 'seq'], name='outbox_stored_relayed_idx'), models.Index(fields=['producer_group', 'message_group', 'relayed_at'], name='outbox_stored_group_idx')],
                'constraints': [models.UniqueConstraint(fields=('message_id',), name='uniq_outbox_stored_message_id')],
            },
        ),
    ]
