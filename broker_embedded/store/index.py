"""The index: message ids and keys to commit log offsets, for "query by id / key".

Persisted as an append-only file of ``<kind><topic>\\x1f<key>\\x1f<offset>\\n`` lines
(kind ``i`` for a message id, ``k`` for a key) and held in memory as dicts. It is derived
data: the store rebuilds it from the commit log past its checkpoint, or from scratch.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

SEP = "\x1f"


class MessageIndex:
    """Message id -> offsets, and (topic, key) -> offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.by_id: dict[str, list[int]] = defaultdict(list)
        self.by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.max_indexed = -1
        if path.exists():
            self._load(path.read_text(encoding="utf-8"))
        self._file = path.open("a", encoding="utf-8")

    def _load(self, text: str) -> None:
        """Read the index file (the hot part of a restart: kept to plain dict work)."""
        by_id, by_key = self.by_id, self.by_key
        highest = -1
        for line in text.splitlines():
            try:
                topic, key, raw_offset = line[1:].split(SEP)
                offset = int(raw_offset)
            except ValueError:
                continue  # a torn last line
            target = by_id[key] if line[0] == "i" else by_key[(topic, key)]
            if not target or target[-1] != offset:
                target.append(offset)
            if offset > highest:
                highest = offset
        self.max_indexed = highest

    def _remember(self, kind: str, topic: str, key: str, offset: int) -> None:
        target = self.by_id[key] if kind == "i" else self.by_key[(topic, key)]
        if offset not in target:
            target.append(offset)
        self.max_indexed = max(self.max_indexed, offset)

    def add(self, topic: str, message_id: str | None, keys: list[str], offset: int) -> None:
        """Index one record (idempotent: a replayed record is not indexed twice)."""
        if offset <= self.max_indexed:
            return
        lines = []
        if message_id:
            lines.append(f"i{topic}{SEP}{message_id}{SEP}{offset}\n")
            self._remember("i", topic, message_id, offset)
        for key in keys:
            lines.append(f"k{topic}{SEP}{key}{SEP}{offset}\n")
            self._remember("k", topic, key, offset)
        self.max_indexed = max(self.max_indexed, offset)
        if lines:
            self._file.write("".join(lines))

    def drop_beyond(self, commit_log_end: int) -> None:
        """Forget offsets at or past the end of the commit log (a torn tail)."""
        for table in (self.by_id, self.by_key):
            for key in list(table):
                kept = [o for o in table[key] if o < commit_log_end]  # type: ignore[index]
                if kept:
                    table[key] = kept  # type: ignore[index]
                else:
                    del table[key]  # type: ignore[arg-type]
        self.max_indexed = min(self.max_indexed, commit_log_end - 1)

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self.flush()
        self._file.close()
