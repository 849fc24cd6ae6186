"""Names of lost records from the transaction records, for ``fsck`` and ``repair``.

The store knows no transactions; these records name messages the damage may have taken:
a commit or park op record carries its half messages' commit log offsets and ids (and a
committed message has its half's id, found through the index by the id's hash), and the
transaction book's snapshot the offsets and ids of the open transactions' half messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec

from ...store.losses import Name
from ...store.record import StoredRecord
from ...topics import OP_HALF_TOPIC
from .book import decode_snapshot
from .ops import decode_op

#: The transaction book's snapshot in a data directory.
SNAPSHOT_FILE = "transactions.snapshot"


class TransactionNames:
    """A ``Namer`` (``broker_embedded.store.losses``) reading the transaction records."""

    def from_record(self, record: StoredRecord) -> Iterable[Name]:
        if record.topic != OP_HALF_TOPIC:
            return ()
        try:
            op = decode_op(record.body)
        except msgspec.DecodeError:
            return ()
        return [*zip(op.half_offsets, op.message_ids, strict=False), *((None, message_id) for message_id in op.message_ids)]

    def from_files(self, data_dir: Path) -> Iterable[Name]:
        try:
            snapshot = decode_snapshot((data_dir / SNAPSHOT_FILE).read_bytes())
        except (OSError, msgspec.DecodeError):
            return ()
        return [(half[0], half[2]) for saved in snapshot.transactions for half in saved.halves]
