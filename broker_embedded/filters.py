"""Filters: which messages of a topic a consumer group's subscription takes.

A subscription is an expression and its type, RocketMQ's ``ExpressionType``: ``TAG``
(the default) or ``SQL92`` (a condition over the message's properties: ``sql_filter``).
``parse_filter`` gives either filter; both answer ``every``, ``matches_hash`` and ``accepts``.

A TAG expression is RocketMQ's TAG type: ``*`` (every message; also the empty expression),
one tag, or tags joined by ``||`` (``TagA || TagB``), spaces around each tag ignored. A
message matches when its tag is one of them (a message without a tag only matches ``*``).
The consume queue keeps a hash of each message's tag (``tag_hash``), so
a message whose hash is none of the filter's is passed over without reading its record; a
hash that matches is confirmed against the stored tag, as RocketMQ does.

Anything else is refused with ``InvalidMessageError``: an empty tag (``TagA ||``), a single
``|``, ``*`` among tags, a tag with whitespace.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidMessageError
from .message import MAX_NAME_LENGTH, is_name
from .sql_filter import SqlFilter, parse_sql92

#: The filter types, as RocketMQ names them (``ExpressionType``).
TAG = "TAG"
SQL92 = "SQL92"
#: The property RocketMQ keeps a message's tag in (an SQL92 filter sees it by this name).
TAG_PROPERTY = "TAGS"


def tag_hash(tag: str) -> int:
    """The tag code a consume queue entry stores (u64; 0 for no tag): CRC32 of the tag."""
    return zlib.crc32(tag.encode()) if tag else 0


#: The expression of every message.
EVERY = "*"
_OR = "||"
#: Longest expression accepted: room for many tags, bounded.
MAX_EXPRESSION_LENGTH = 16 * 1024


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed TAG expression; ``tags`` is empty for ``*``."""

    expression: str
    tags: frozenset[str] = frozenset()
    hashes: frozenset[int] = frozenset()

    @property
    def every(self) -> bool:
        """Whether every message matches (``*``)."""
        return not self.tags

    def matches_hash(self, hashed: int) -> bool:
        """Whether a consume queue entry with tag hash ``hashed`` may match (confirm with
        ``matches``)."""
        return not self.tags or hashed in self.hashes

    def matches(self, tag: str) -> bool:
        """Whether a message tagged ``tag`` ("" for none) matches."""
        return not self.tags or tag in self.tags

    def accepts(self, properties: Mapping[str, str]) -> bool:
        """Whether a message with ``properties`` (its tag under ``TAGS``) matches."""
        return self.matches(properties.get(TAG_PROPERTY, ""))


#: A parsed subscription of either type.
Subscription = TagFilter | SqlFilter


#: The filter of every message.
EVERY_MESSAGE = TagFilter(EVERY)


def parse_filter(expression: str, filter_type: str = TAG) -> Subscription:
    """The filter of an expression of ``filter_type`` (``TAG`` or ``SQL92``);
    ``InvalidMessageError`` when either is malformed or the type unknown."""
    if filter_type == TAG:
        return parse_tag_filter(expression)
    if filter_type == SQL92:
        return _parsed_sql92(_bounded(expression))
    raise InvalidMessageError(f"filter type {filter_type!r:.40}: not {TAG!r} or {SQL92!r}")


def parse_tag_filter(expression: str) -> TagFilter:
    """The filter of a TAG expression; ``InvalidMessageError`` when it is malformed."""
    return _parsed_tags(_bounded(expression))


def _bounded(expression: str) -> str:
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidMessageError(f"a filter expression is text of up to {MAX_EXPRESSION_LENGTH} characters, "
                                  f"not {expression!r:.80}")
    return expression


@functools.lru_cache(maxsize=256)  # consumers repeat their expression on every receive
def _parsed_sql92(expression: str) -> SqlFilter:
    return parse_sql92(expression)


@functools.lru_cache(maxsize=256)
def _parsed_tags(expression: str) -> TagFilter:
    if expression.strip() in ("", EVERY):
        return EVERY_MESSAGE
    tags = [part.strip() for part in expression.split(_OR)]
    for tag in tags:
        if not is_name(tag) or "|" in tag or tag == EVERY:
            raise InvalidMessageError(
                f"filter {expression!r:.200}: not a TAG expression ('*', a tag, or tags joined by '||', each "
                f"up to {MAX_NAME_LENGTH} printable characters without whitespace or '|'); "
                "an SQL92 filter has the type SQL92")
    return TagFilter(expression, frozenset(tags), frozenset(tag_hash(tag) for tag in tags))
