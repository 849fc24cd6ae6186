"""The index: message ids and keys to commit log offsets, for "query by id / key".

Persisted as an append-only file of ``<kind><topic>\\x1f<key>\\x1f<offset>\\n`` lines
(kind ``i`` for a message id, ``k`` for a key), in commit log order, and held in memory as
dicts. Lines are written at checkpoints (``persist``); a failed write (disk full) is cut
back to the last whole line and retried later. It is derived data: the store rebuilds it
from the commit log past its checkpoint, or from scratch.

Opening reads only the file's last line; ``start_loading`` parses the rest in a thread so
a restart does not wait for it, and lookups wait until it is done.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import defaultdict
from pathlib import Path

SEP = "\x1f"
_SEP_BYTES = SEP.encode()


def _offset_of(line: bytes | str) -> int:
    if isinstance(line, bytes):
        return int(line.rsplit(_SEP_BYTES, 1)[1])
    return int(line.rsplit(SEP, 1)[1])


class MessageIndex:
    """Message id -> offsets, and (topic, key) -> offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.by_id: dict[str, list[int]] = defaultdict(list)
        self.by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._late: list[tuple[str, str, str, int]] = []  # added before the load finished
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        raw = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        whole = raw.rfind(b"\n") + 1
        if whole != len(raw):
            os.ftruncate(self.fd, whole)  # a torn last line
        self._raw = raw[:whole]
        self.file_size = whole
        last_line = self._raw[self._raw.rfind(b"\n", 0, whole - 1) + 1 :]
        self.max_indexed = _offset_of(last_line) if last_line else -1

    def start_loading(self) -> None:
        """Parse the file into memory in a background thread."""
        threading.Thread(target=self._load, name="store-index-load", daemon=True).start()

    def _load(self) -> None:
        by_id: dict[str, list[int]] = defaultdict(list)
        by_key: dict[tuple[str, str], list[int]] = defaultdict(list)
        for line in self._raw.decode("utf-8").splitlines():
            try:
                topic, key, raw_offset = line[1:].split(SEP)
                offset = int(raw_offset)
            except ValueError:
                continue  # a key holding the separator: not queryable after a restart
            target = by_id[key] if line[0] == "i" else by_key[(topic, key)]
            if not target or target[-1] != offset:
                target.append(offset)
        with self._lock:
            for kind, topic, key, offset in self._late:
                (by_id[key] if kind == "i" else by_key[(topic, key)]).append(offset)
            self.by_id, self.by_key = by_id, by_key
            self._late, self._raw = [], b""
            self._loaded.set()

    def add(self, topic: str, message_id: str | None, keys: list[str], offset: int) -> None:
        """Index one record (idempotent: a replayed record is not indexed twice)."""
        if offset <= self.max_indexed:
            return
        self.max_indexed = offset
        with self._lock:
            loaded = self._loaded.is_set()
            if message_id:
                self._pending.append(f"i{topic}{SEP}{message_id}{SEP}{offset}\n")
                if loaded:
                    self.by_id[message_id].append(offset)
                else:
                    self._late.append(("i", topic, message_id, offset))
            for key in dict.fromkeys(keys):
                self._pending.append(f"k{topic}{SEP}{key}{SEP}{offset}\n")
                if loaded:
                    self.by_key[(topic, key)].append(offset)
                else:
                    self._late.append(("k", topic, key, offset))

    def lookup_id(self, message_id: str) -> list[int]:
        self._loaded.wait()
        with self._lock:
            return list(self.by_id.get(message_id, ()))

    def lookup_key(self, topic: str, key: str) -> list[int]:
        self._loaded.wait()
        with self._lock:
            return list(self.by_key.get((topic, key), ()))

    def drop_beyond(self, commit_log_end: int) -> None:
        """Forget offsets at or past the end of the commit log (a torn tail), in the file
        and in what is not yet written. Called during recovery, before ``start_loading``."""
        if self.max_indexed < commit_log_end:
            return
        self._pending = [line for line in self._pending if _offset_of(line) < commit_log_end]
        self._late = [entry for entry in self._late if entry[3] < commit_log_end]
        keep = 0
        for line in self._raw.splitlines(keepends=True):
            if _offset_of(line) >= commit_log_end:
                break
            keep += len(line)
        os.ftruncate(self.fd, keep)
        self._raw = self._raw[:keep]
        self.file_size = keep
        self.max_indexed = commit_log_end - 1

    def unpersisted(self) -> tuple[int, bytes]:
        """``(file position, bytes)`` of lines not yet written (call under the store's
        write lock; write them with ``persist`` outside it)."""
        with self._lock:
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
        with self._lock:
            self._pending.insert(0, data.decode("utf-8"))
        self.file_size = start

    def close(self) -> None:
        self._loaded.wait()
        os.close(self.fd)
