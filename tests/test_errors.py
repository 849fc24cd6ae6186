"""Typed broker errors survive a round trip through their wire code."""

import pytest

from broker_embedded import errors


@pytest.mark.parametrize(
    "cls",
    [errors.TransactionConflictError, errors.ReservedTopicError, errors.RequestTimeoutError],
)
def test_error_for_code_rebuilds_the_same_type(cls: type[errors.BrokerError]) -> None:
    rebuilt = errors.error_for_code(cls.code, "why")
    assert type(rebuilt) is cls
    assert str(rebuilt) == "why"


def test_unknown_code_is_still_a_broker_error() -> None:
    rebuilt = errors.error_for_code("NO_SUCH_CODE", "why")
    assert type(rebuilt) is errors.BrokerError
    assert "NO_SUCH_CODE" in str(rebuilt)
