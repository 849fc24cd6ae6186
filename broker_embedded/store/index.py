"""The index: message ids and keys to commit log offsets, for "query by id / key".

Persisted as an append-only file of ``<kind><topic>\\x1f<key>\\x1f<offset>\\n`` lines
(kind ``i`` for a message id, ``k`` for a key), in commit log order, and held in memory as
dicts. Lines are written at checkpoints (``persist``); a failed write (disk full) is cut
back to the last whole line and retried later. It is derived data: the store rebuilds it
from the commit log past its checkpoint, or from scratch.
"""

from __future__ import annotations

import errno
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
        self._pending: list[str] = []
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        raw = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        whole = raw.rfind(b"\n") + 1
        if whole != len(raw):
            os.ftruncate(self.fd, whole)  # a torn last line
        self.file_size = whole
        self._load(raw[:whole].decode("utf-8"))

    def _load(self, text: str) -> None:
        """Read the index file (the hot part of a restart: kept to plain dict work)."""
        by_id, by_key = self.by_id, self.by_key
        highest = -1
        for line in text.splitlines():
            try:
                topic, key, raw_offset = line[1:].split(SEP)
                offset = int(raw_offset)
            except ValueError:
                continue  # a key holding the separator: not queryable after a restart
            target = by_id[key] if line[0] == "i" else by_key[(topic, key)]
            if not target or target[-1] != offset:
                target.append(offset)
            if offset > highest:
                highest = offset
        self.max_indexed = highest

    def add(self, topic: str, message_id: str | None, keys: list[str], offset: int) -> None:
        """Index one record (idempotent: a replayed record is not indexed twice)."""
        if offset <= self.max_indexed:
            return
        self.max_indexed = offset
        if message_id:
            self._pending.append(f"i{topic}{SEP}{message_id}{SEP}{offset}\n")
            self.by_id[message_id].append(offset)
        for key in dict.fromkeys(keys):
            self._pending.append(f"k{topic}{SEP}{key}{SEP}{offset}\n")
            self.by_key[(topic, key)].append(offset)

    def drop_beyond(self, commit_log_end: int) -> None:
        """Forget offsets at or past the end of the commit log (a torn tail), in memory
        and in the file."""
        if self.max_indexed < commit_log_end:
            return
        for table in (self.by_id, self.by_key):
            for key in list(table):
                kept = [o for o in table[key] if o < commit_log_end]  # type: ignore[index]
                if kept:
                    table[key] = kept  # type: ignore[index]
                else:
                    del table[key]  # type: ignore[arg-type]
        self._pending = [line for line in self._pending if int(line.rsplit(SEP, 1)[1]) < commit_log_end]
        raw = os.pread(self.fd, self.file_size, 0)
        keep = 0
        for line in raw.splitlines(keepends=True):
            if int(line.rsplit(SEP.encode(), 1)[1]) >= commit_log_end:
                break
            keep += len(line)
        os.ftruncate(self.fd, keep)
        self.file_size = keep
        self.max_indexed = commit_log_end - 1

    def unpersisted(self) -> tuple[int, bytes]:
        """``(file position, bytes)`` of lines not yet written (call under the store's
        write lock; write them with ``persist`` outside it)."""
        data = "".join(self._pending).encode("utf-8")
        self._pending = []
        start, self.file_size = self.file_size, self.file_size + len(data)
        return start, data

    def persist(self, start: int, data: bytes) -> None:
        """Write and fsync lines from ``unpersisted``; on failure the file is cut back to
        ``start`` and the lines are raised for a later retry (``restore``)."""
        if not data:
            return
        try:
            if os.pwrite(self.fd, data, start) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(self.fd)
        except OSError:
            os.ftruncate(self.fd, start)
            raise

    def restore(self, start: int, data: bytes) -> None:
        """Put back lines whose ``persist`` failed, ahead of any added since."""
        self._pending.insert(0, data.decode("utf-8"))
        self.file_size = start

    def close(self) -> None:
        os.close(self.fd)
