"""RocketMQ 5 ``Status`` values for the broker's outcomes: which ``Code`` each error means."""

from __future__ import annotations

import logging

from ...errors import (
    AuthenticationError,
    BrokerClosedError,
    BrokerError,
    InvalidMessageError,
    InvalidTopicError,
    MessageTooLargeError,
    RequestTimeoutError,
    ServerBusyError,
    TransactionConflictError,
    UnknownReceiptError,
    UnknownTopicError,
    UnknownTransactionError,
    UnsupportedError,
)
from ._proto import definition_pb2 as pb

log = logging.getLogger(__name__)

#: The RocketMQ code of each broker error (the most specific class that matches wins).
ERROR_CODES: tuple[tuple[type[BaseException], pb.Code], ...] = (
    (UnknownTransactionError, pb.INVALID_TRANSACTION_ID),
    (TransactionConflictError, pb.PRECONDITION_FAILED),
    (UnknownReceiptError, pb.INVALID_RECEIPT_HANDLE),
    (UnknownTopicError, pb.TOPIC_NOT_FOUND),
    (InvalidTopicError, pb.ILLEGAL_TOPIC),
    (MessageTooLargeError, pb.MESSAGE_BODY_TOO_LARGE),
    (InvalidMessageError, pb.BAD_REQUEST),
    (AuthenticationError, pb.UNAUTHORIZED),
    (ServerBusyError, pb.TOO_MANY_REQUESTS),
    (RequestTimeoutError, pb.PROXY_TIMEOUT),
    (UnsupportedError, pb.UNSUPPORTED),
    (BrokerClosedError, pb.INTERNAL_SERVER_ERROR),
    (ValueError, pb.BAD_REQUEST),
    (TypeError, pb.BAD_REQUEST),
)


def ok() -> pb.Status:
    return pb.Status(code=pb.OK, message="OK")


def status_of(error: BaseException) -> pb.Status:
    """The status that answers ``error``: its RocketMQ code and the error's text; anything
    unexpected is INTERNAL_SERVER_ERROR and logged."""
    for kind, code in ERROR_CODES:
        if isinstance(error, kind):
            return pb.Status(code=code, message=f"{type(error).__name__}: {error}")
    if not isinstance(error, BrokerError):
        log.error("a gRPC request failed", exc_info=error)
    return pb.Status(code=pb.INTERNAL_SERVER_ERROR, message=f"{type(error).__name__}: {error}")
