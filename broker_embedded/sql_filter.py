"""SQL92 property filters: RocketMQ's ``MessageSelector.bySql`` / ``FilterExpressionType.SQL92``.

An expression is a condition over a message's properties (its user properties, and the
system ones RocketMQ exposes alike: ``TAGS`` is the tag, ``KEYS`` the keys). The subset:

- comparisons ``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=`` of a property with a literal
  (or another property); ``<``, ``<=``, ``>``, ``>=`` take numbers only, as in RocketMQ;
- ``BETWEEN low AND high`` and ``NOT BETWEEN`` (numbers; ``low <= high`` when both are literals);
- ``IN ('a', 'b')`` and ``NOT IN`` (a property and string literals, at most ``MAX_IN_ITEMS``);
- ``CONTAINS 'x'`` and ``NOT CONTAINS`` (a property and a string literal);
- ``IS NULL`` and ``IS NOT NULL``; ``AND``, ``OR``, ``NOT``, parentheses; ``TRUE``, ``FALSE``;
- literals: strings in single quotes (``''`` is a quote), integers (64 bits, an optional
  ``L``), decimals (``1.5``, ``.5``, ``1e3``), with an optional sign.

Keywords are case-insensitive; property names (``[A-Za-z_$][A-Za-z0-9_$]*``) are not.
``NOT`` binds tighter than a comparison, as in RocketMQ's grammar, so it takes a condition
in parentheses (``NOT (a = 1)``) or ``TRUE``/``FALSE``; ``NOT a = 1`` is refused rather
than read as RocketMQ would (``(NOT a) = 1``). Also refused: a property alone as a
condition, ``NULL`` outside ``IS [NOT] NULL``, ``LIKE``, arithmetic, comments, and
``<``-style comparisons with string literals.

Evaluation is RocketMQ's three-valued logic: a missing property makes any comparison with
it unknown, and a message matches only when the whole condition is true (``a <> 'x'``
does not match a message without ``a``; ``NOT (a = 1)`` does not either). A property is
text: compared with a number literal it is read as one (an integer literal wants an
integer, a decimal literal any number), with ``TRUE``/``FALSE`` as ``true`` in any case;
when it does not read as a number the message does not match at all, as RocketMQ's
evaluation fails then. ``<``-style comparisons of two properties read both as numbers.

Malformed or unsupported text raises ``InvalidMessageError`` naming the position.
Bounded: ``MAX_DEPTH`` nested parentheses/``NOT``/signs, ``MAX_IN_ITEMS`` per ``IN``,
and the caller's bound on the expression's length.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidMessageError

#: Deepest nesting of parentheses, ``NOT`` and signs.
MAX_DEPTH = 32
#: Most strings in one ``IN`` list.
MAX_IN_ITEMS = 1000

_INT64 = 1 << 63
_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS"})
_WHITESPACE = " \t\n\r\f"
_TOKEN = re.compile(
    r"(?P<float>(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))"
    r"|(?P<int>(?:0|[1-9]\d*)[lL]?)"
    r"|(?P<name>[A-Za-z_$][A-Za-z0-9_$]*)"
    r"|(?P<op><>|<=|>=|[=<>(),+-])",
    re.ASCII)
_INTEGER_TEXT = re.compile(r"[+-]?\d+", re.ASCII)
_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)

Literal = str | int | float | bool
Properties = Mapping[str, str]


class _Unmatched(Exception):
    """A property that does not read as the literal's type: the message does not match."""


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "int", "float", "str", "name", "op", a keyword, or "end"
    text: str
    position: int
    value: Literal = ""


# -- values and conditions -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Property:
    name: str

    def value(self, properties: Properties) -> Literal | None:
        return properties.get(self.name)


@dataclass(frozen=True, slots=True)
class _Constant:
    literal: Literal

    def value(self, properties: Properties) -> Literal | None:
        return self.literal


_Value = _Property | _Constant
#: A condition: true, false, or None (unknown) for a message's properties.
_Condition = Callable[[Properties], "bool | None"]


def _as_type_of(text: str, other: Literal) -> Literal:
    """``text`` (a property) read as ``other``'s type, as RocketMQ converts string expressions."""
    if isinstance(other, bool):
        return text.lower() == "true"
    if isinstance(other, int):
        if _INTEGER_TEXT.fullmatch(text) and -_INT64 <= int(text) < _INT64:
            return int(text)
        raise _Unmatched
    if isinstance(other, float):
        if _NUMBER_TEXT.fullmatch(text):
            return float(text)
        raise _Unmatched
    return text


def _comparable(left: Literal, right: Literal, ordering: bool) -> tuple[Literal, Literal] | None:
    """The two sides made comparable; None when they never are equal (a boolean and a number)."""
    if isinstance(left, str) and isinstance(right, str):
        if not ordering:
            return left, right
        if _NUMBER_TEXT.fullmatch(left) and _NUMBER_TEXT.fullmatch(right):
            return float(left), float(right)
        raise _Unmatched  # RocketMQ compares no strings with < <= > >=
    if isinstance(left, str):
        return _as_type_of(left, right), right
    if isinstance(right, str):
        return left, _as_type_of(right, left)
    if isinstance(left, bool) != isinstance(right, bool):
        return None
    return left, right


_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt,
                                                      ">=": operator.ge}


def _comparison(operator: str, left: _Value, right: _Value) -> _Condition:
    ordering = _ORDERINGS.get(operator)

    def compare(properties: Properties) -> bool | None:
        lv, rv = left.value(properties), right.value(properties)
        if lv is None or rv is None:
            return None
        pair = _comparable(lv, rv, ordering is not None)
        if ordering is not None:
            return pair is not None and ordering(*pair)
        equal = pair is not None and pair[0] == pair[1]
        return equal if operator == "=" else not equal

    return compare


def _is_null(value: _Value, negated: bool) -> _Condition:
    return lambda properties: (value.value(properties) is None) != negated


def _in(value: _Property, items: frozenset[str], negated: bool) -> _Condition:
    def member(properties: Properties) -> bool | None:
        found = value.value(properties)
        return None if found is None else (found in items) != negated

    return member


def _contains(value: _Property, part: str, negated: bool) -> _Condition:
    def contains(properties: Properties) -> bool | None:
        found = value.value(properties)
        return None if found is None else (part in str(found)) != negated

    return contains


def _not(condition: _Condition) -> _Condition:
    def negation(properties: Properties) -> bool | None:
        result = condition(properties)
        return None if result is None else not result

    return negation


def _all(conditions: list[_Condition]) -> _Condition:
    """AND: false as soon as one is false (the rest not evaluated), else unknown if one is."""
    def conjunction(properties: Properties) -> bool | None:
        unknown = False
        for condition in conditions:
            result = condition(properties)
            if result is False:
                return False
            unknown |= result is None
        return None if unknown else True

    return conjunction


def _any(conditions: list[_Condition]) -> _Condition:
    """OR: true as soon as one is true, else unknown if one is."""
    def disjunction(properties: Properties) -> bool | None:
        unknown = False
        for condition in conditions:
            result = condition(properties)
            if result is True:
                return True
            unknown |= result is None
        return None if unknown else False

    return disjunction


def _constant(result: bool) -> _Condition:
    return lambda properties: result


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A parsed SQL92 expression: ``matches`` a message's properties."""

    expression: str
    condition: _Condition

    #: An SQL92 filter never takes every message unread.
    every = False

    def matches_hash(self, hashed: int) -> bool:
        """Any tag hash may match: properties are only known from the record."""
        return True

    def accepts(self, properties: Properties) -> bool:
        """Whether a message with ``properties`` matches (the condition is true)."""
        try:
            return self.condition(properties) is True
        except _Unmatched:
            return False


# -- parsing ------------------------------------------------------------------------------------
def _tokens(expression: str, fail: Callable[[str, int], InvalidMessageError]) -> list[_Token]:
    tokens: list[_Token] = []
    at, end = 0, len(expression)
    while at < end:
        char = expression[at]
        if char in _WHITESPACE:
            at += 1
            continue
        if char == "'":
            close = at + 1
            while True:
                close = expression.find("'", close)
                if close < 0:
                    raise fail("unterminated string", at)
                if expression.startswith("''", close):
                    close += 2
                    continue
                break
            text = expression[at:close + 1]
            tokens.append(_Token("str", text, at, text[1:-1].replace("''", "'")))
            at = close + 1
            continue
        match = _TOKEN.match(expression, at)
        if match is None:
            raise fail(f"unexpected {char!r}", at)
        text, kind = match.group(), match.lastgroup or ""
        if kind == "float":
            tokens.append(_Token("float", text, at, float(text)))
        elif kind == "int":
            number = int(text.rstrip("lL"))
            if number > _INT64:  # -2**63 is written as a sign and 2**63
                raise fail("integer out of range", at)
            tokens.append(_Token("int", text, at, number))
        elif kind == "name" and text.upper() in _KEYWORDS:
            tokens.append(_Token(text.upper(), text, at))
        else:
            tokens.append(_Token(kind, text, at))
        at = match.end()
    tokens.append(_Token("end", "", end))
    return tokens


class _Parser:
    """Recursive descent over the tokens, RocketMQ's precedence: OR, AND, ``=``/``<>``/``IS``,
    ``<``/``BETWEEN``/``IN``/``CONTAINS``, then ``NOT`` and signs, then literals, names and
    parentheses."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = _tokens(expression, self.error)
        self.at = 0
        self.depth = 0

    def error(self, what: str, position: int) -> InvalidMessageError:
        return InvalidMessageError(f"SQL92 filter {self.expression!r:.200}: {what} at position {position}")

    @property
    def token(self) -> _Token:
        return self.tokens[self.at]

    def take(self, *kinds: str) -> _Token | None:
        token = self.token
        if token.kind in kinds or (token.kind == "op" and token.text in kinds):
            self.at += 1
            return token
        return None

    def expect(self, kind: str, what: str) -> _Token:
        token = self.take(kind)
        if token is None:
            raise self.unexpected(what)
        return token

    def unexpected(self, wanted: str) -> InvalidMessageError:
        token = self.token
        found = "the end" if token.kind == "end" else repr(token.text)
        return self.error(f"expected {wanted}, found {found}", token.position)

    def parse(self) -> _Condition:
        condition = self.condition(self.disjunction(), self.tokens[0])
        if self.token.kind != "end":
            raise self.unexpected("AND, OR or the end")
        return condition

    def condition(self, node: _Value | _Condition, start: _Token) -> _Condition:
        """``node`` as a condition: TRUE and FALSE are; other values are refused."""
        if isinstance(node, _Constant) and isinstance(node.literal, bool):
            return _constant(node.literal)
        if isinstance(node, _Property | _Constant):
            raise self.error(f"{start.text!r} is a value, not a condition", start.position)
        return node

    def value(self, node: _Value | _Condition, start: _Token) -> _Value:
        if not isinstance(node, _Property | _Constant):
            raise self.error("a condition where a value belongs", start.position)
        return node

    def disjunction(self) -> _Value | _Condition:
        start = self.token
        first = self.conjunction()
        if self.token.kind != "OR":
            return first
        conditions = [self.condition(first, start)]
        while self.take("OR"):
            start = self.token
            conditions.append(self.condition(self.conjunction(), start))
        return _any(conditions)

    def conjunction(self) -> _Value | _Condition:
        start = self.token
        first = self.equality()
        if self.token.kind != "AND":
            return first
        conditions = [self.condition(first, start)]
        while self.take("AND"):
            start = self.token
            conditions.append(self.condition(self.equality(), start))
        return _all(conditions)

    def equality(self) -> _Value | _Condition:
        start = self.token
        left = self.comparison()
        if operator := self.take("=", "<>"):
            right_start = self.token
            right = self.value(self.comparison(), right_start)
            return _comparison(operator.text, self.value(left, start), right)
        if self.take("IS"):
            negated = self.take("NOT") is not None
            self.expect("NULL", "NULL")
            return _is_null(self.value(left, start), negated)
        return left

    def comparison(self) -> _Value | _Condition:
        start = self.token
        left = self.unary()
        if operator := self.take("<", "<=", ">", ">="):
            right_start = self.token
            right = self.number_or_property(self.unary(), right_start)
            return _comparison(operator.text, self.number_or_property(left, start), right)
        negated = self.token.kind == "NOT" and self.tokens[self.at + 1].kind in ("BETWEEN", "IN", "CONTAINS")
        if negated:
            self.at += 1
        if self.take("BETWEEN"):
            return self.between(self.number_or_property(left, start), negated)
        if self.take("IN"):
            return _in(self.property(left, start), self.in_list(), negated)
        if self.take("CONTAINS"):
            part = self.expect("str", "a string literal")
            return _contains(self.property(left, start), str(part.value), negated)
        return left

    def between(self, value: _Value, negated: bool) -> _Condition:
        low_start = self.token
        low = self.number_or_property(self.unary(), low_start)
        self.expect("AND", "AND")
        high_start = self.token
        high = self.number_or_property(self.unary(), high_start)
        if isinstance(low, _Constant) and isinstance(high, _Constant) and low.literal > high.literal:  # type: ignore[operator]
            raise self.error(f"BETWEEN {low_start.text} AND {high_start.text}: the low bound is above the high",
                             low_start.position)
        if negated:
            return _any([_comparison("<", value, low), _comparison(">", value, high)])
        return _all([_comparison(">=", value, low), _comparison("<=", value, high)])

    def in_list(self) -> frozenset[str]:
        self.expect("(", "'(' after IN")
        items = [self.expect("str", "a string literal").value]
        while self.take(","):
            if len(items) >= MAX_IN_ITEMS:
                raise self.error(f"more than {MAX_IN_ITEMS} strings in IN", self.token.position)
            items.append(self.expect("str", "a string literal").value)
        self.expect(")", "',' or ')'")
        return frozenset(str(item) for item in items)

    def number_or_property(self, node: _Value | _Condition, start: _Token) -> _Value:
        value = self.value(node, start)
        if isinstance(value, _Constant) and isinstance(value.literal, bool | str):
            raise self.error(f"{start.text!r} cannot be compared with < <= > >= or BETWEEN (numbers only)",
                             start.position)
        return value

    def property(self, node: _Value | _Condition, start: _Token) -> _Property:
        if not isinstance(node, _Property):
            raise self.error("IN and CONTAINS take a property on their left", start.position)
        return node

    def unary(self) -> _Value | _Condition:
        start = self.token
        if start.kind == "NOT" or (start.kind == "op" and start.text in ("-", "+")):
            self.nest(start)
            self.at += 1
            operand_start = self.token
            operand = self.primary() if operand_start.kind == "int" else self.unary()  # -2**63 is in range
            self.depth -= 1
            if start.kind == "NOT":
                if isinstance(operand, _Property):
                    raise self.error("NOT takes a condition: write NOT (...)", start.position)
                return _not(self.condition(operand, operand_start))
            if not (isinstance(operand, _Constant) and isinstance(operand.literal, int | float)
                    and not isinstance(operand.literal, bool)):
                raise self.error(f"a sign takes a number, not {operand_start.text!r}", start.position)
            if start.text == "+":
                return operand
            number = -operand.literal
            if isinstance(number, int) and number < -_INT64:
                raise self.error("integer out of range", start.position)
            return _Constant(number)
        if start.kind == "int" and start.value == _INT64:
            raise self.error("integer out of range", start.position)  # only -2**63 is an int64
        return self.primary()

    def nest(self, start: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}", start.position)

    def primary(self) -> _Value | _Condition:
        token = self.token
        self.at += 1
        if token.kind in ("str", "int", "float"):
            return _Constant(token.value)
        if token.kind in ("TRUE", "FALSE"):
            return _Constant(token.kind == "TRUE")
        if token.kind == "name":
            return _Property(token.text)
        if token.kind == "op" and token.text == "(":
            self.nest(token)
            inner = self.disjunction()
            self.depth -= 1
            self.expect(")", "')'")
            return inner
        self.at -= 1
        if token.kind == "NULL":
            raise self.error("NULL only in IS NULL and IS NOT NULL", token.position)
        raise self.unexpected("a property, a literal or '('")


def parse_sql92(expression: str) -> SqlFilter:
    """The filter of an SQL92 expression; ``InvalidMessageError`` (with the position) when
    it is malformed or outside the subset."""
    return SqlFilter(expression, _Parser(expression).parse())
