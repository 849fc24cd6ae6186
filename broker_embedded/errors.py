"""Typed errors of the broker. Every error has a stable ``code`` so it survives the wire."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the broker or its clients raise."""

    code = "BROKER_ERROR"


class InvalidTopicError(BrokerError):
    """The topic name is empty, too long, or has characters outside ``[A-Za-z0-9_.%-]``."""

    code = "INVALID_TOPIC"


class ReservedTopicError(InvalidTopicError):
    """The topic is a system topic (``RMQ_SYS_*``, ``%DLQ%*``, ``%RETRY%*``, ...)."""

    code = "RESERVED_TOPIC"


class UnknownTopicError(BrokerError):
    """The topic does not exist and auto-creation is off."""

    code = "UNKNOWN_TOPIC"


class MessageTooLargeError(BrokerError):
    """The body is larger than ``max_body_size``."""

    code = "MESSAGE_TOO_LARGE"


class InvalidMessageError(BrokerError, ValueError):
    """A field of the message, or an argument of the call, is out of range (delay level,
    property names, a topic's queue count, a receive's durations, ...). Also a
    ``ValueError``: in-process calls raised plain ``ValueError`` for some of these once, and
    code catching that keeps working."""

    code = "INVALID_MESSAGE"


class UnknownTransactionError(BrokerError):
    """END_TRANSACTION names a transaction id the broker never stored a half message for."""

    code = "UNKNOWN_TRANSACTION"


class TransactionConflictError(BrokerError):
    """END_TRANSACTION contradicts the resolution the broker already recorded."""

    code = "TRANSACTION_CONFLICT"


class CheckUnansweredError(BrokerError):
    """An operator's check of a parked transaction got no COMMIT or ROLLBACK: no checker of
    its producer group took the check, none answered in time, or the answer was UNKNOWN.
    Nothing was changed."""

    code = "CHECK_UNANSWERED"


class UnknownGroupError(BrokerError):
    """The consumer group has no progress and no dead letters on this broker (never used,
    or deleted already)."""

    code = "UNKNOWN_GROUP"


class GroupInUseError(BrokerError):
    """The consumer group cannot be deleted now: a receive of it is running, or messages it
    received are still in flight. Stop its consumers (and let their messages be acked or
    their invisible time end), then delete it."""

    code = "GROUP_IN_USE"


class UnknownReceiptError(BrokerError):
    """ACK or CHANGE_INVISIBLE_DURATION with a receipt handle that is unknown or expired."""

    code = "UNKNOWN_RECEIPT"


class MalformedFrameError(BrokerError):
    """A protocol frame could not be decoded."""

    code = "MALFORMED_FRAME"


class ReplyTooLargeError(BrokerError):
    """An answer would exceed the protocol's frame limit; the server sent this instead."""

    code = "REPLY_TOO_LARGE"


class UnknownRequestCodeError(BrokerError):
    """A protocol frame names a request code the server does not know."""

    code = "UNKNOWN_REQUEST_CODE"


class StoreFullError(BrokerError):
    """The disk is full; the send was refused and nothing already stored was touched."""

    code = "STORE_FULL"


class CorruptLogError(BrokerError):
    """A commit log record failed its CRC or magic check somewhere other than the torn tail."""

    code = "CORRUPT_LOG"


class CorruptStateError(BrokerError):
    """A state file of a data directory cannot be read: ``store.json`` (its layout, which is
    not guessed), or the loss ledger ``losses.json`` where nothing may set it aside (``fsck``,
    ``losses``)."""

    code = "CORRUPT_STATE"


class DataDirLockedError(BrokerError):
    """Another broker holds the lock on this data directory."""

    code = "DATA_DIR_LOCKED"


class AuthenticationError(BrokerError):
    """The access key or signature was missing or wrong."""

    code = "AUTHENTICATION_FAILED"


class ExportPathError(BrokerError):
    """EXPORT_MESSAGES named a directory outside the server's export root."""

    code = "EXPORT_PATH_REFUSED"


class BrokerClosedError(BrokerError):
    """The broker (or the client) was closed."""

    code = "BROKER_CLOSED"


class BrokerUnavailableError(BrokerError):
    """The client could not reach the broker (connection refused, reset, or closed)."""

    code = "BROKER_UNAVAILABLE"


class ServerBusyError(BrokerUnavailableError):
    """The server refused the work for now: it is at one of its limits (connections, long
    polls of one connection; see ``ServerLimits``). Retry later."""

    code = "SERVER_BUSY"


class RequestTimeoutError(BrokerUnavailableError):
    """The broker did not answer within the request timeout; the outcome is unknown."""

    code = "REQUEST_TIMEOUT"


class UnsupportedError(BrokerError):
    """The broker backend cannot do this: a RocketMQ 5 proxy (``rocketmq5://``) offers no
    admin API (parked transactions, exports, open transactions, DLQ, stats, queue reads)."""

    code = "UNSUPPORTED"


def _all_subclasses(cls: type[BrokerError]) -> list[type[BrokerError]]:
    found: list[type[BrokerError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def error_for_code(code: str, message: str) -> BrokerError:
    """Rebuild the typed error named by ``code`` (used by clients decoding a server reply)."""
    candidates: list[type[BrokerError]] = [BrokerError, *_all_subclasses(BrokerError)]
    for cls in candidates:
        if cls.code == code:
            return cls(message)
    return BrokerError(f"{code}: {message}")
