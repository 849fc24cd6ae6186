"""The topic registry: user topics and their queue counts (RocketMQ's TopicConfigManager).

Kept in ``topics.json`` in the data directory, replaced atomically on every change.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import zlib
from pathlib import Path

from ..errors import InvalidMessageError, UnknownTopicError
from ..message import Message, validate_topic_once
from ..store.files import write_atomically
from ..store.filesystem import REAL, FileSystem
from ..topics import MAX_QUEUES, validate_user_topic

log = logging.getLogger(__name__)


class TopicRegistry:
    """User topics by name; thread-safe."""

    def __init__(self, path: Path, auto_create: bool, default_queues: int, fs: FileSystem = REAL) -> None:
        self.path = path
        self.fs = fs
        self.auto_create = auto_create
        self.default_queues = default_queues
        self._lock = threading.Lock()
        self._round_robin = itertools.count()
        self.queues: dict[str, int] = (
            {str(k): int(v) for k, v in json.loads(fs.read_bytes(path)).items()} if fs.exists(path) else {}
        )

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

    def _save(self) -> None:
        write_atomically(self.path, json.dumps(self.queues, sort_keys=True).encode(), self.fs)
