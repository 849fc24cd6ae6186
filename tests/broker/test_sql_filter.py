"""SQL92 property filters: the parser's table (what matches which properties, what is
refused and where), hostile text, and receive through ``EmbeddedBroker``."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_embedded import EmbeddedBroker, Message
from broker_embedded.broker import codec
from broker_embedded.errors import InvalidMessageError
from broker_embedded.filters import MAX_EXPRESSION_LENGTH, SQL92, parse_filter
from broker_embedded.sql_filter import MAX_DEPTH, MAX_IN_ITEMS, parse_sql92

#: Properties of the messages of the table: a number, a decimal, text, a tag, a flag.
MESSAGES = {
    "small": {"a": "3", "price": "9.5", "region": "eu", "TAGS": "paid", "vip": "TRUE"},
    "big": {"a": "10", "price": "120", "region": "us", "TAGS": "created"},
    "text": {"a": "abc", "region": "it's"},
    "bare": {},
}

MATCHES = [
    ("a > 5", {"big"}),
    ("a >= 3", {"small", "big"}),
    ("a < 5", {"small"}),
    ("a <= 10", {"small", "big"}),
    ("a = 3", {"small"}),
    ("a <> 3", {"big"}),  # "text" does not read as an integer, "bare" has no a: neither matches
    ("a = '3'", {"small"}),
    ("a <> '3'", {"big", "text"}),
    ("price > 10", {"big"}),  # "120" reads as an integer
    ("price > 9.25", {"small", "big"}),
    ("price = 9.5", {"small"}),
    ("price < 10", set()),  # "9.5" does not read as an integer: the message does not match
    ("a > -1.5e1", {"small", "big"}),
    ("a > +2", {"small", "big"}),
    ("a = 3L", {"small"}),
    ("region = 'eu'", {"small"}),
    ("region = 'it''s'", {"text"}),
    ("region IN ('eu', 'us')", {"small", "big"}),
    ("region NOT IN ('eu')", {"big", "text"}),
    ("TAGS = 'paid'", {"small"}),
    ("TAGS IS NULL", {"text", "bare"}),
    ("region IS NOT NULL", {"small", "big", "text"}),
    ("a BETWEEN 3 AND 5", {"small"}),
    ("a NOT BETWEEN 3 AND 5", {"big"}),
    ("region CONTAINS 's'", {"big", "text"}),
    ("region NOT CONTAINS 's'", {"small"}),
    ("vip = TRUE", {"small"}),
    ("vip = FALSE", set()),
    ("TRUE", {"small", "big", "text", "bare"}),
    ("FALSE", set()),
    ("NOT (a = 3)", {"big"}),  # unknown stays unknown under NOT
    ("NOT (region IS NULL)", {"small", "big", "text"}),
    ("a > 5 OR region = 'eu'", {"small", "big"}),
    ("a > 5 AND region = 'eu'", set()),
    ("region = 'it''s' OR a > 5", {"big", "text"}),
    ("a = 3 OR region = 'it''s'", {"small"}),  # "abc" = 3 fails the whole evaluation, as in RocketMQ
    ("(a > 1 OR missing = 'x') AND (price IS NULL OR price < 100.0)", {"small"}),
    ("missing = 'x' OR TRUE", {"small", "big", "text", "bare"}),
    ("a > 5 and region = 'us' Or Not (tRuE)", {"big"}),
    ("p1 > p2", set()),  # absent both
    ("a = a", {"small", "big", "text"}),
    ("((((a = 10))))", {"big"}),
]


@pytest.mark.parametrize(("expression", "expected"), MATCHES, ids=[m[0] for m in MATCHES])
def test_an_expression_matches_these_messages(expression: str, expected: set[str]) -> None:
    subscription = parse_filter(expression, SQL92)
    assert {name for name, properties in MESSAGES.items() if subscription.accepts(properties)} == expected


def test_comparing_two_properties_reads_both_as_numbers() -> None:
    subscription = parse_sql92("low < high")
    assert subscription.accepts({"low": "9", "high": "10.5"})
    assert not subscription.accepts({"low": "10", "high": "9"})
    assert not subscription.accepts({"low": "a", "high": "b"})  # strings are not ordered


REFUSED = [
    ("", "expected a property, a literal or '\\(', found the end at position 0"),
    ("a", "'a' is a value, not a condition at position 0"),
    ("a > 5 AND", "found the end at position 9"),
    ("a >", "at position 3"),
    ("a > 'x'", "numbers only\\) at position 4"),
    ("'x' < a", "numbers only\\) at position 0"),
    ("a > TRUE", "numbers only"),
    ("a BETWEEN 'x' AND 'y'", "numbers only"),
    ("a BETWEEN 5 AND 3", "the low bound is above the high at position 10"),
    ("a BETWEEN 1 OR 3", "expected AND"),
    ("a IN ()", "expected a string literal"),
    ("a IN (1, 2)", "expected a string literal"),
    ("a IN 'x'", "'\\(' after IN"),
    ("5 IN ('x')", "take a property on their left"),
    ("a CONTAINS 5", "expected a string literal"),
    ("a = NULL", "NULL only in IS NULL"),
    ("a IS 5", "expected NULL"),
    ("NOT a = 1", "NOT takes a condition"),
    ("NOT 5", "'5' is a value"),
    ("(a = 1", "expected '\\)', found the end at position 6"),
    ("a = 1)", "expected AND, OR or the end, found '\\)' at position 5"),
    ("a = 'x", "unterminated string at position 4"),
    ("a == 1", "at position 3"),
    ("a != 1", "unexpected '!' at position 2"),
    ("a LIKE 'x%'", "'a' is a value, not a condition at position 0"),
    ("a = 1 -- comment", "found '-' at position 6"),
    ("a = 007", "found '0' at position 5"),
    ("a = 9223372036854775808", "integer out of range"),
    ("a = -9223372036854775809", "integer out of range"),
    ("a = 99999999999999999999999", "integer out of range"),
    ("naïve = 1", "unexpected 'ï' at position 2"),
    ("a = 1 AND (b = 2 OR c > 3) = TRUE", "a condition where a value belongs"),
    ("-a > 1", "a sign takes a number, not 'a'"),
    ("a = 1 a = 2", "expected AND, OR or the end, found 'a' at position 6"),
    ("a.b = 1", "unexpected '.' at position 1"),
]


@pytest.mark.parametrize(("expression", "error"), REFUSED, ids=[r[0] or "empty" for r in REFUSED])
def test_a_malformed_expression_is_refused_with_its_position(expression: str, error: str) -> None:
    with pytest.raises(InvalidMessageError, match=error):
        parse_filter(expression, SQL92)


def test_the_int64_bounds_are_literals() -> None:
    assert parse_sql92("a = -9223372036854775808").accepts({"a": "-9223372036854775808"})
    assert parse_sql92("a = 9223372036854775807").accepts({"a": "9223372036854775807"})


def test_hostile_expressions_are_bounded() -> None:
    deep = "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(InvalidMessageError, match=f"nested deeper than {MAX_DEPTH}"):
        parse_sql92(deep)
    with pytest.raises(InvalidMessageError, match="nested deeper"):
        parse_sql92("NOT " * 5000 + "TRUE")
    with pytest.raises(InvalidMessageError, match="nested deeper"):
        parse_sql92("a = " + "-" * 5000 + "1")
    assert parse_sql92("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH).accepts({"a": "1"})
    many = ", ".join(f"'{n}'" for n in range(MAX_IN_ITEMS))
    assert parse_sql92(f"a IN ({many})").accepts({"a": str(MAX_IN_ITEMS - 1)})
    with pytest.raises(InvalidMessageError, match=f"more than {MAX_IN_ITEMS} strings in IN"):
        parse_sql92(f"a IN ({many}, 'x')")
    with pytest.raises(InvalidMessageError, match="up to .* characters"):
        parse_filter("a = '" + "x" * MAX_EXPRESSION_LENGTH + "'", SQL92)
    long_chain = " OR ".join(f"a = {n}" for n in range(1500))  # flat, not nested: evaluated without recursion
    assert parse_sql92(long_chain).accepts({"a": "1499"})


FRAGMENTS = ["a", "b", "TAGS", "(", ")", "=", "<>", "<", "<=", ">", ">=", "AND", "OR", "NOT", "IS", "NULL",
             "BETWEEN", "IN", "CONTAINS", "TRUE", "FALSE", "'x'", "'", "''", ",", "1", "-", "+", "1.5", "e3", ".",
             "0", "9" * 25, "L", "\u00e9", "\u0663", "\U0001f600", "\x00", "\t", "\u2028", "--", "/*", "$", "_"]
CONDITIONS = ["a > 1", "a <= -2.5", "b = 'x'", "b <> 'it''s'", "TAGS IN ('t', 'u')", "a NOT BETWEEN 0 AND 2",
              "a IS NULL", "b IS NOT NULL", "b CONTAINS 'x'", "TRUE", "FALSE", "a = b", "a >= 1e3", "b = TRUE"]


#: Well-formed expressions of the subset: conditions joined by AND/OR (any case), negated.
EXPRESSIONS = st.recursive(
    st.sampled_from(CONDITIONS),
    lambda inner: st.one_of(
        inner.map(lambda expression: f"NOT ({expression})"),
        st.tuples(st.lists(inner, min_size=2, max_size=3), st.sampled_from(("AND", "OR", "and", "Or")))
        .map(lambda parts: "(" + f" {parts[1]} ".join(parts[0]) + ")"),
    ),
    max_leaves=24,
)
#: Words of the grammar, broken words, and arbitrary characters.
WORDS = st.sampled_from(FRAGMENTS) | st.text(max_size=3)
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None)
FILTER_MESSAGES = [{}, {"a": "1", "b": "x", "TAGS": "t"}, {"a": "abc", "b": "true"}, {"a": "5000.5"}]


def _mutated(text: str, edits: list[tuple[int, int, str]]) -> str:
    """``text`` with some of its words dropped, repeated, swapped or replaced by ``WORDS``."""
    words = text.split(" ")
    for at, change, word in edits:
        at %= len(words)
        if change == 0 and len(words) > 1:
            del words[at]
        elif change == 1:
            words.insert(at, words[at])
        elif change == 2:
            other = len(words) - 1 - at
            words[at], words[other] = words[other], words[at]
        else:
            words[at] = word
    return " ".join(words)


def _parses_or_refuses_quickly(text: str) -> bool:
    """``text`` parses (and then evaluates to a yes or no for each message) or is refused with
    ``InvalidMessageError``, never anything else, within a second; whether it parsed."""
    started = time.monotonic()
    try:
        subscription = parse_sql92(text)
    except InvalidMessageError:
        parsed = False
    else:
        parsed = True
        for properties in FILTER_MESSAGES:
            assert subscription.accepts(properties) in (True, False)
    assert time.monotonic() - started < 1.0, text
    return parsed


@FUZZ
@given(EXPRESSIONS)
def test_a_well_formed_expression_parses_and_evaluates(expression: str) -> None:
    assert _parses_or_refuses_quickly(expression), expression


@FUZZ
@given(EXPRESSIONS, st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 3), WORDS), min_size=1, max_size=3))
def test_a_mangled_expression_parses_or_raises_the_typed_error_quickly(
        expression: str, edits: list[tuple[int, int, str]]) -> None:
    _parses_or_refuses_quickly(_mutated(expression, edits))


@FUZZ
@given(st.lists(WORDS, max_size=30).map(" ".join) | st.text(max_size=300))
def test_arbitrary_text_parses_or_raises_the_typed_error_quickly(text: str) -> None:
    _parses_or_refuses_quickly(text)


def _take(broker: EmbeddedBroker, group: str, expression: str) -> list[str]:
    got = []
    while batch := broker.receive(group, "orders", max_messages=3, filter_expression=expression, filter_type=SQL92):
        for received in batch:
            got.append(received.message.body.decode())
            broker.ack(group, received.receipt_handle)
    return sorted(got)


def test_receive_with_an_sql92_filter_skips_the_others_for_the_group(broker_factory) -> None:
    broker = broker_factory()
    for n, (amount, region, tag) in enumerate([(3, "eu", "paid"), (12, "eu", "paid"), (40, "us", "created")]):
        broker.send(Message("orders", f"m{n}".encode(), tag=tag,
                            properties={"amount": str(amount), "region": region}))
    broker.send(Message("orders", b"plain"))
    broker.send(Message("orders", b"shadow", tag="real", properties={"TAGS": "fake"}))  # the tag wins
    assert _take(broker, "big-eu", "amount > 5 AND region = 'eu'") == ["m1"]
    assert _take(broker, "paid", "TAGS = 'paid'") == ["m0", "m1"]
    assert _take(broker, "real", "TAGS IN ('real', 'fake')") == ["shadow"]
    assert _take(broker, "big-eu", "TRUE") == []  # the others were consumed for the group
    assert broker.stats().consumer_lag["big-eu"] == {"orders": 0}
    assert _take(broker, "untagged", "TAGS IS NULL") == ["plain"]
    broker.close()
    broker = broker_factory()  # the skips are recorded
    assert _take(broker, "paid", "TRUE") == []


def test_a_malformed_sql92_filter_or_unknown_type_changes_nothing(broker_factory) -> None:
    broker = broker_factory()
    broker.send(Message("orders", b"m", properties={"a": "1"}))
    with pytest.raises(InvalidMessageError, match="position"):
        broker.receive("g", "orders", filter_expression="a >", filter_type=SQL92)
    with pytest.raises(InvalidMessageError, match="filter type 'XPATH'"):
        broker.receive("g", "orders", filter_expression="a", filter_type="XPATH")
    assert broker.stats().consumer_lag == {}
    assert _take(broker, "g", "a = 1") == ["m"]


def test_a_filter_sees_the_user_properties_by_name_and_the_tag_as_tags() -> None:
    stored = codec.message_properties(Message("orders", b"", tag="real", keys=("k",),
                                              properties={"amount": "5", "TAGS": "fake"}))
    assert dict(codec.FilterProperties(stored)) == {"amount": "5", "TAGS": "real"}
    assert "UNIQ_KEY" not in codec.FilterProperties(stored)
