"""The topic registry: user topics and their queue counts (RocketMQ's TopicConfigManager).

Kept in ``topics.json`` in the data directory, replaced atomically on every change, the
version before it kept as ``topics.json.bak`` (as RocketMQ keeps its config files'). A
``topics.json`` that cannot be read (damage on the disk) keeps no broker from starting: it is
moved to ``topics.json.unreadable`` and the topics are taken from the backup, with any topic
the store holds records of that the backup lacks (the one created last) added with the
queues its records are in, at least ``default_queues``; logged as an ERROR.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import InvalidMessageError, InvalidTopicError, UnknownTopicError
from ..message import Message, validate_topic_once
from ..store.files import set_aside, write_atomically
from ..store.filesystem import REAL, FileSystem
from ..topics import MAX_QUEUES, validate_user_topic

log = logging.getLogger(__name__)

#: The registry's file before its last change, next to it.
BACKUP_SUFFIX = ".bak"


class TopicRegistry:
    """User topics by name; thread-safe. ``stored``: the topics the store holds records of,
    with their queue counts (read only if ``path`` cannot be)."""

    def __init__(self, path: Path, auto_create: bool, default_queues: int, fs: FileSystem = REAL,
                 stored: Callable[[], Mapping[str, int]] = dict) -> None:
        self.path = path
        self.fs = fs
        self.auto_create = auto_create
        self.default_queues = default_queues
        self._lock = threading.Lock()
        self._round_robin = itertools.count()
        self.queues: dict[str, int] = {}
        if fs.exists(path):
            try:
                self.queues = _parsed(fs.read_bytes(path))
            except ValueError as exc:
                self._recover(str(exc), stored())

    def __contains__(self, topic: str) -> bool:
        return topic in self.queues

    def __len__(self) -> int:
        return len(self.queues)

    def names(self) -> list[str]:
        with self._lock:  # create may add one meanwhile
            return sorted(self.queues)

    def create(self, topic: str, queues: int) -> int:
        """Create ``topic`` with ``queues`` queues unless it exists; its queue count."""
        validate_user_topic(topic)
        if not 1 <= queues <= MAX_QUEUES:
            raise InvalidMessageError(f"a topic has 1 to {MAX_QUEUES} queues")
        with self._lock:
            if topic not in self.queues:
                self.queues[topic] = queues
                self._save()
                log.info("created topic %s with %d queues", topic, queues)
            return self.queues[topic]

    def ensure(self, topic: str) -> int:
        """The queue count of a usable topic, creating it when auto-creation is on (a
        name is checked once, not on every message)."""
        validate_topic_once(topic)
        queues = self.queues.get(topic)
        if queues is None:
            if not self.auto_create:
                raise UnknownTopicError(f"topic {topic!r} does not exist")
            queues = self.create(topic, self.default_queues)
        return queues

    def select_queue(self, message: Message) -> int:
        """A message group always maps to one queue (FIFO); other messages go round-robin."""
        queues = self.ensure(message.topic)
        if message.message_group:
            return zlib.crc32(message.message_group.encode()) % queues
        return next(self._round_robin) % queues

    def _recover(self, problem: str, stored: Mapping[str, int]) -> None:
        """``path`` cannot be read: moved aside; the topics taken from the backup and the store."""
        backup = self.path.with_name(self.path.name + BACKUP_SUFFIX)
        source = "no backup"
        if self.fs.exists(backup):
            try:
                self.queues, source = _parsed(self.fs.read_bytes(backup)), backup.name
            except ValueError as exc:
                source = f"no backup ({backup.name} cannot be read either: {exc})"
        added = {topic: max(queues, self.default_queues) for topic, queues in stored.items()
                 if _is_user_topic(topic) and topic not in self.queues}
        self.queues.update(added)
        aside = set_aside(self.path, self.fs)
        self._save()
        log.error("%s cannot be read (%s): moved to %s; the topics are taken from %s, and %s from the records "
                  "stored: check their queue counts", self.path, problem, aside.name, source,
                  ", ".join(f"{topic} ({queues} queues)" for topic, queues in sorted(added.items())) or "none")

    def _save(self) -> None:
        if self.fs.exists(self.path):
            write_atomically(self.path.with_name(self.path.name + BACKUP_SUFFIX), self.fs.read_bytes(self.path),
                             self.fs)
        write_atomically(self.path, json.dumps(self.queues, sort_keys=True).encode(), self.fs)


def _parsed(data: bytes) -> dict[str, int]:
    """A registry file's topics; ``ValueError`` unless it is a JSON object of topic names and
    queue counts."""
    queues = json.loads(data)
    if not isinstance(queues, dict) or not all(
            isinstance(topic, str) and type(count) is int and 1 <= count <= MAX_QUEUES
            for topic, count in queues.items()):
        raise ValueError("not a JSON object of topic names and queue counts")
    return queues


def _is_user_topic(topic: str) -> bool:
    try:
        validate_user_topic(topic)
    except InvalidTopicError:
        return False
    return True
