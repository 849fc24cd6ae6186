"""Typed errors of the framework (broker errors come from ``broker_embedded.errors``)."""

from __future__ import annotations

from broker_embedded import errors as broker_errors


class OutboxError(Exception):
    """Base class of the framework's own errors."""


class BodyNotSerializableError(OutboxError, TypeError):
    """The message body could not be serialised; nothing was sent."""


class BrokerUnavailableError(OutboxError, broker_errors.BrokerUnavailableError):
    """The broker could not be reached to send a message (a half message: nothing ran,
    nothing was written). Wraps the broker client's error, kept as ``__cause__``; also a
    ``broker_embedded.errors.BrokerUnavailableError``."""


#: The former name of ``BrokerUnavailableError``.
BrokerUnavailable = BrokerUnavailableError


class TransactionFencedError(OutboxError):
    """A checker fenced this transaction id before the local transaction recorded it: the
    broker was told ROLLBACK, so this transaction must not commit (it was rolled back)."""


class SavepointError(OutboxError):
    """The first message of a transaction was sent inside a SAVEPOINT; send it at the
    outermost level so a rolled-back savepoint cannot remove the transaction_log row."""


class ConfigurationError(OutboxError):
    """A setting is missing or invalid."""


class NestedTransactionError(ConfigurationError):
    """A ``@transactional_message`` call cannot join the transaction it was called in
    (another database, another producer, a session the decorator was not given); the
    message says what to do. Nothing was sent."""


class SchemaMissingError(ConfigurationError):
    """A framework table (``outbox_transaction_log``, ``outbox_consumed_message``) does not
    exist in the database; the message names the command that creates it."""


def missing_extra(module: str, extra: str, cause: ModuleNotFoundError) -> ImportError:
    """The ``ImportError`` of ``module`` when the packages of its extra are not installed."""
    return ImportError(f"{module} needs {cause.name}: pip install 'halfmoon[{extra}]'", name=cause.name)
