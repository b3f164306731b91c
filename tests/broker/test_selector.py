"""JMS message selectors (JMS 2.0 §3.8.1): grammar, three-valued logic, header mapping, filters, fuzzing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    Data,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp.types import Described, Symbol, Timestamp, UByte, ULong
from minibroker.broker.selector import (
    SELECTOR_DESCRIPTORS,
    MessageFields,
    Selector,
    SelectorError,
    selector_from_filter,
)

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)


def msg(props: dict[str, Any] | None = None, **fields: Any) -> MessageFields:
    return MessageFields(props or {}, **fields)


def select(selector: str, message: MessageFields) -> bool:
    return Selector(selector).matches(message)


def truth(expression: str, message: MessageFields) -> str:
    """The three-valued result of a boolean expression: T, F or U(nknown)."""
    if select(expression, message):
        return "T"
    if select(f"NOT ({expression})", message):
        return "F"
    return "U"


# -- the table: selector x message -> selected? ------------------------------------------------------
P = {"i": 10, "j": 3, "neg": -7, "f": 2.5, "s": "abc", "t": True, "fl": False, "z": 0, "zf": 0.0, "big": LONG_MAX}

CASES: list[tuple[str, dict[str, Any], bool]] = [
    # literals
    ("s = 'abc'", P, True),
    ("s = 'ABC'", P, False),
    ("q = 'it''s'", {"q": "it's"}, True),
    ("q = ''''", {"q": "'"}, True),
    ("q = ''", {"q": ""}, True),
    ("i = 10", P, True),
    ("f = 2.5", P, True),
    ("x = 1e3", {"x": 1000}, True),
    ("x = 1.5E-3", {"x": 0.0015}, True),
    ("x = 7.", {"x": 7}, True),
    ("x = .5", {"x": 0.5}, True),
    ("x = 1.e2", {"x": 100.0}, True),
    ("t = TRUE", P, True),
    ("t = true", P, True),
    ("fl = False", P, True),
    ("t", P, True),
    ("fl", P, False),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("x = -9223372036854775808", {"x": LONG_MIN}, True),
    ("x = 9223372036854775807", {"x": LONG_MAX}, True),
    # identifiers: Java rules, case-sensitive; reserved words case-insensitive
    ("I = 10", P, False),
    ("$x_1 = 1 and _y = 2", {"$x_1": 1, "_y": 2}, True),
    ("größe = 3", {"größe": 3}, True),
    ("i = 10 or i = 11", P, True),
    ("not i = 11", P, True),
    ("s is not null", P, True),
    # arithmetic and its precedence
    ("i + j * 2 = 16", P, True),
    ("(i + j) * 2 = 26", P, True),
    ("i - j - 2 = 5", P, True),
    ("i / j / 2 = 1", P, True),
    ("-i * 2 = -20", P, True),
    ("- - i = 10", P, True),
    ("+i = 10", P, True),
    ("-f = -2.5", P, True),
    ("i * -1 = -10", P, True),
    ("neg / 2 = -3", P, True),  # Java long division truncates toward zero
    ("i / 4 = 2", P, True),
    ("i / 4.0 = 2.5", P, True),
    ("i + f = 12.5", P, True),
    ("big + 1 = -9223372036854775808", P, True),  # Java long overflow wraps
    ("-9223372036854775808 / -1 = -9223372036854775808", {}, True),
    ("i / z = 1", P, False),  # division by zero is UNKNOWN
    ("NOT (i / z = 1)", P, False),
    ("(i / zf) IS NULL", P, True),
    ("s + 1 = 1", P, False),  # arithmetic on a string is UNKNOWN
    ("NOT (s + 1 = 1)", P, False),
    ("t + 1 = 2", P, False),  # a boolean is not a number
    ("-s IS NULL", P, True),
    ("+s IS NULL", P, True),
    ("missing * 2 IS NULL", P, True),
    # comparisons
    ("i = 10", P, True),
    ("i <> 10", P, False),
    ("i <> 11", P, True),
    ("i < 11", P, True),
    ("i < 10", P, False),
    ("i <= 10", P, True),
    ("i > 9", P, True),
    ("i > 10", P, False),
    ("i >= 10", P, True),
    ("i = 10.0", P, True),  # exact and approximate numerics compare by value
    ("f > 2", P, True),
    ("f < 3", P, True),
    ("i = '10'", P, False),  # unlike types: FALSE, for = and <> alike
    ("i <> '10'", P, False),
    ("s = 1", P, False),
    ("s <> 1", P, False),
    ("t = 1", P, False),
    ("t <> 1", P, False),
    ("t = 'true'", P, False),
    ("s < other", {"s": "a", "other": "b"}, False),  # strings do not order (§3.8.1.2)
    ("s > other", {"s": "a", "other": "b"}, False),
    ("s = other", {"s": "a", "other": "a"}, True),
    ("bin = bin", {"bin": b"x"}, False),  # binary compares equal to nothing
    ("sym = 'abc'", {"sym": Symbol("abc")}, True),
    ("(i > 5) = TRUE", P, True),
    ("(i > 5) <> (j > 5)", P, True),
    ("nan = nan", {"nan": float("nan")}, False),
    ("inf > big", {"inf": float("inf"), "big": LONG_MAX}, True),
    ("huge > big", {"huge": 2**64 - 1, "big": LONG_MAX}, True),  # a ulong beyond long, by value
    # BETWEEN
    ("i BETWEEN 10 AND 12", P, True),
    ("i BETWEEN 8 AND 10", P, True),
    ("i BETWEEN 11 AND 12", P, False),
    ("i BETWEEN 9.5 AND 10.5", P, True),
    ("i BETWEEN j * 3 AND j * 4", P, True),
    ("i NOT BETWEEN 11 AND 12", P, True),
    ("i NOT BETWEEN 10 AND 12", P, False),
    ("i BETWEEN 1 AND 20 AND s = 'abc'", P, True),
    ("missing BETWEEN 1 AND 2", P, False),
    ("missing NOT BETWEEN 1 AND 2", P, False),
    ("s BETWEEN 1 AND 2", P, False),  # "s >= 1 AND s <= 2": FALSE
    ("s NOT BETWEEN 1 AND 2", P, False),  # "s < 1 OR s > 2": FALSE too
    ("i BETWEEN missing AND 20", P, False),
    ("i NOT BETWEEN missing AND 5", P, True),  # "i < NULL OR i > 5": UNKNOWN OR TRUE
    # IN
    ("s IN ('x', 'abc', 'y')", P, True),
    ("s IN ('x')", P, False),
    ("s NOT IN ('x', 'y')", P, True),
    ("s NOT IN ('abc')", P, False),
    ("missing IN ('x')", P, False),
    ("missing NOT IN ('x')", P, False),
    ("i IN ('10')", P, False),  # "(i = '10')": FALSE
    ("i NOT IN ('10')", P, True),  # its negation: TRUE
    ("s IN ('it''s', 'abc')", P, True),
    # LIKE
    ("s LIKE 'abc'", P, True),
    ("s LIKE 'ab'", P, False),
    ("s LIKE 'a%'", P, True),
    ("s LIKE '%c'", P, True),
    ("s LIKE '%b%'", P, True),
    ("s LIKE 'a_c'", P, True),
    ("s LIKE 'a_'", P, False),
    ("s LIKE '___'", P, True),
    ("s LIKE '%'", P, True),
    ("e LIKE '%'", {"e": ""}, True),
    ("e LIKE '_'", {"e": ""}, False),
    ("s LIKE 'a%%c'", P, True),
    ("s LIKE '%a%b%c%'", P, True),
    ("s LIKE '%c%a'", P, False),
    ("w LIKE 'ab%ab'", {"w": "abab"}, True),
    ("w LIKE 'ab%ab'", {"w": "aba"}, False),  # prefix and suffix may not overlap
    ("w LIKE '%ab%ab%'", {"w": "xxabyyabzz"}, True),
    ("w LIKE '%ab%ab%'", {"w": "xxabzz"}, False),
    ("w LIKE 'a.c'", {"w": "abc"}, False),  # regex characters are literal
    ("w LIKE 'a.c'", {"w": "a.c"}, True),
    ("w LIKE '[a]*'", {"w": "[a]*"}, True),
    ("w LIKE 'a%'", {"w": "a\nb"}, True),
    ("w LIKE 'a_b'", {"w": "a\nb"}, True),
    ("name LIKE 'a\\_%' ESCAPE '\\'", {"name": "a_bc"}, True),
    ("name LIKE 'a\\_%' ESCAPE '\\'", {"name": "abc"}, False),
    ("name LIKE '100!%' ESCAPE '!'", {"name": "100%"}, True),
    ("name LIKE '100!%' ESCAPE '!'", {"name": "1000"}, False),
    ("name LIKE 'a!!b' ESCAPE '!'", {"name": "a!b"}, True),
    ("name LIKE '!a%' ESCAPE '!'", {"name": "abc"}, True),  # an escaped ordinary character is itself
    ("name LIKE 'x%' ESCAPE 'x'", {"name": "%"}, True),
    ("s NOT LIKE 'a%'", P, False),
    ("s NOT LIKE 'b%'", P, True),
    ("missing LIKE '%'", P, False),
    ("missing NOT LIKE '%'", P, False),
    ("i LIKE '%'", P, False),  # LIKE on a non-string is UNKNOWN
    ("i NOT LIKE '%'", P, False),
    ("sym LIKE 'ab%'", {"sym": Symbol("abc")}, True),
    # IS NULL
    ("missing IS NULL", P, True),
    ("missing IS NOT NULL", P, False),
    ("s IS NULL", P, False),
    ("s IS NOT NULL", P, True),
    ("n IS NULL", {"n": None}, True),  # present with the AMQP null value
    ("(i + missing) IS NULL", P, True),
    # logic and its precedence: NOT > AND > OR
    ("i = 10 OR i = 11 AND j = 99", P, True),
    ("(i = 10 OR i = 11) AND j = 99", P, False),
    ("NOT i = 11 AND j = 3", P, True),
    ("NOT (i = 10 AND j = 3)", P, False),
    ("NOT NOT t", P, True),
    ("i = 11 OR j = 4 OR s = 'abc'", P, True),
    ("i = 10 AND j = 3 AND s = 'x'", P, False),
    ("s", P, False),  # a non-boolean in a boolean context is UNKNOWN
    ("NOT s", P, False),
    ("NOT missing", P, False),
    ("missing OR t", P, True),
    ("missing AND fl", P, False),
    ("NOT (missing AND fl)", P, True),
    # whitespace
    ("\ti\n=\r10\f", P, True),
    ("i=10 AND(j=3)", P, True),
]


@pytest.mark.parametrize(("selector", "props", "expected"), CASES, ids=[c[0] for c in CASES])
def test_selection(selector: str, props: dict[str, Any], expected: bool) -> None:
    assert select(selector, msg(props)) is expected


# -- three-valued logic (§3.8.1.1 tables) ------------------------------------------------------------
TRUTH_PROPS = {"T": {"p": True}, "F": {"p": False}, "U": {}}
AND = {("T", "T"): "T", ("T", "F"): "F", ("T", "U"): "U", ("F", "F"): "F", ("F", "U"): "F", ("U", "U"): "U"}
OR = {("T", "T"): "T", ("T", "F"): "T", ("T", "U"): "T", ("F", "F"): "F", ("F", "U"): "U", ("U", "U"): "U"}
NOT = {"T": "F", "F": "T", "U": "U"}


def _two(x: str, y: str) -> MessageFields:
    props = {}
    if x != "U":
        props["x"] = x == "T"
    if y != "U":
        props["y"] = y == "T"
    return msg(props)


@pytest.mark.parametrize("x", ["T", "F", "U"])
@pytest.mark.parametrize("y", ["T", "F", "U"])
def test_and_or_truth_tables(x: str, y: str) -> None:
    key = (x, y) if (x, y) in AND else (y, x)
    assert truth("x AND y", _two(x, y)) == AND[key]
    assert truth("x OR y", _two(x, y)) == OR[key]


@pytest.mark.parametrize("x", ["T", "F", "U"])
def test_not_truth_table(x: str) -> None:
    assert truth("NOT p", msg(TRUTH_PROPS[x])) == NOT[x]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("missing = 1", "U"),
        ("missing <> 1", "U"),
        ("missing < 1", "U"),
        ("1 = missing", "U"),
        ("missing = missing", "U"),
        ("missing IS NULL", "T"),
        ("missing LIKE 'a'", "U"),
        ("missing IN ('a')", "U"),
        ("missing BETWEEN 1 AND 2", "U"),
        ("i / 0 > 1", "U"),
        ("s = 1", "F"),
        ("s < 1", "F"),
        ("i LIKE 'a'", "U"),
        ("i IN ('a')", "F"),
        ("i = 10 AND missing = 1", "U"),
        ("i = 11 AND missing = 1", "F"),
        ("i = 10 OR missing = 1", "T"),
        ("i = 11 OR missing = 1", "U"),
    ],
)
def test_unknown_propagation(expression: str, expected: str) -> None:
    assert truth(expression, msg(P)) == expected


# -- JMS header fields as Qpid JMS maps them onto AMQP -----------------------------------------------
UID = uuid.UUID("11111111-2222-3333-4444-555555555555")
HEADER_CASES: list[tuple[str, MessageFields, bool]] = [
    ("JMSPriority = 4", msg(), True),
    ("JMSPriority = 9", msg(priority=9), True),
    ("JMSPriority > 5", msg(priority=UByte(7)), True),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", msg(), True),
    ("JMSDeliveryMode = 'PERSISTENT'", msg(durable=True), True),
    ("JMSDeliveryMode = 'PERSISTENT'", msg(durable=False), False),
    ("JMSMessageID = 'ID:abc'", msg(message_id="ID:abc"), True),
    ("JMSMessageID = 'ID:AMQP_NO_PREFIX:abc'", msg(message_id="abc"), True),
    ("JMSMessageID = 'ID:AMQP_STRING:ID:AMQP_UUID:x'", msg(message_id="ID:AMQP_UUID:x"), True),
    (f"JMSMessageID = 'ID:AMQP_UUID:{UID}'", msg(message_id=UID), True),
    ("JMSMessageID = 'ID:AMQP_ULONG:42'", msg(message_id=ULong(42)), True),
    ("JMSMessageID = 'ID:AMQP_BINARY:00AB'", msg(message_id=b"\x00\xab"), True),
    ("JMSMessageID IS NULL", msg(), True),
    ("JMSMessageID LIKE 'ID:%'", msg(message_id="ID:x"), True),
    ("JMSCorrelationID = 'abc'", msg(correlation_id="abc"), True),  # an application string, kept as sent
    ("JMSCorrelationID = 'ID:abc'", msg(correlation_id="ID:abc"), True),
    ("JMSCorrelationID = 'ID:AMQP_ULONG:7'", msg(correlation_id=ULong(7)), True),
    ("JMSCorrelationID IS NULL", msg(), True),
    ("JMSType = 'order'", msg(subject="order"), True),
    ("JMSType IS NULL", msg(), True),
    ("JMSTimestamp = 1700000000000", msg(creation_time=Timestamp(1700000000000)), True),
    ("JMSTimestamp = 0", msg(), True),
    ("JMSExpiration > 0", msg(absolute_expiry_time=Timestamp(5)), True),
    ("JMSExpiration = 0", msg(), True),
    # header identifiers read the header, never an application property of the same name
    ("JMSPriority = 9", msg({"JMSPriority": 9}), False),
    ("JMSType = 'x'", msg({"JMSType": "x"}), False),
    # any other name, JMSX ones included, is an application property
    ("JMSXGroupID = 'g'", msg({"JMSXGroupID": "g"}), True),
    ("jmspriority = 1", msg({"jmspriority": 1}), True),
    ("JMSPriority = 9 AND kind = 'x' OR JMSType = 'y'", msg({"kind": "x"}, priority=9), True),
]


@pytest.mark.parametrize(("selector", "message", "expected"), HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_header_identifiers(selector: str, message: MessageFields, expected: bool) -> None:
    assert select(selector, message) is expected


# -- invalid selectors -------------------------------------------------------------------------------
INVALID: list[tuple[str, str, int]] = [
    # (selector, part of the message, 1-based column)
    ("(a = 1", "expected ')' to close the '(' at column 1, found end of selector", 7),
    ("a = 1)", "unexpected ')' after a complete expression", 6),
    ("((a = 1)", "expected ')'", 9),
    ("a = 'abc", "unterminated string literal", 5),
    ("a = 'it''s", "unterminated string literal", 5),
    ("a == 1", "unknown operator '==' (use = or <>)", 3),
    ("a != 1", "unknown operator '!=' (use = or <>)", 3),
    ("a ~ 1", "unexpected character '~'", 3),
    ("a = #", "unexpected character '#'", 5),
    ("a = ", "expected an expression, found end of selector", 5),
    ("a = 1 b", "unexpected 'b' after a complete expression", 7),
    ("a = 1 2", "unexpected '2' after a complete expression", 7),
    ("and = 1", "found reserved word AND (reserved words are not identifiers)", 1),
    ("a = 1 AND between = 2", "found reserved word BETWEEN", 11),
    ("Like = 1", "found reserved word LIKE", 1),
    ("escape = 1", "found reserved word ESCAPE", 1),
    ("a = NULL", "NULL can only be tested with IS [NOT] NULL", 5),
    ("a IS 1", "expected NULL or NOT NULL after IS", 6),
    ("a IS NOT 1", "expected NULL after IS NOT", 10),
    ("a NOT 1", "expected BETWEEN, IN or LIKE after NOT", 7),
    ("a BETWEEN 1", "expected AND between the bounds of BETWEEN", 12),
    ("a BETWEEN 1 OR 2", "expected AND between the bounds of BETWEEN, found reserved word OR", 13),
    ("a BETWEEN 'x' AND 2", "an operand of BETWEEN must be a numeric expression, not a string one", 11),
    ("a IN 'x'", "expected '(' after IN", 6),
    ("a IN ()", "an IN list item must be a string literal, found ')'", 7),
    ("a IN (1, 2)", "an IN list item must be a string literal, found '1'", 7),
    ("a IN ('x' 'y')", "expected ',' or ')' in the IN list", 11),
    ("a IN ('x',)", "an IN list item must be a string literal", 11),
    ("1 IN ('x')", "the operand of IN must be a string expression, not a numeric one", 1),
    ("a LIKE b", "the LIKE pattern must be a string literal, found 'b'", 8),
    ("a LIKE 'x' ESCAPE 'ab'", "the ESCAPE character must be one character, not 'ab'", 19),
    ("a LIKE 'x' ESCAPE ''", "the ESCAPE character must be one character", 19),
    ("a LIKE 'x!' ESCAPE '!'", "LIKE pattern ends with its escape character", 8),
    ("TRUE LIKE 'x'", "the operand of LIKE must be a string expression, not a boolean one", 1),
    ("a < 'x'", "strings can only be compared with = and <>", 5),
    ("TRUE > a", "booleans can only be compared with = and <>", 1),
    ("a = 1 = 2", "comparisons cannot be chained; use parentheses", 7),
    ("a < b < c", "comparisons cannot be chained", 7),
    ("a IS NULL IS NULL", "comparisons cannot be chained", 11),
    ("1", "a selector must be a boolean expression, not a numeric one", 1),
    ("'x'", "a selector must be a boolean expression, not a string one", 1),
    ("a + 1", "a selector must be a boolean expression, not a numeric one", 1),
    ("a AND 1", "an operand of AND must be a boolean expression", 7),
    ("1 OR a", "an operand of OR must be a boolean expression", 1),
    ("NOT 'x'", "the operand of NOT must be a boolean expression, not a string one", 5),
    ("a + 'x' = 1", "an operand of + must be a numeric expression, not a string one", 5),
    ("TRUE * 2 = 1", "an operand of * must be a numeric expression, not a boolean one", 1),
    ("-'x' = 1", "the operand of unary - must be a numeric expression", 2),
    ("(a = 1) + 1 = 2", "an operand of + must be a numeric expression, not a boolean one", 1),
    ("a = 9223372036854775808", "integer literal 9223372036854775808 is out of range of a long", 5),
    ("a = -9223372036854775809", "integer literal -9223372036854775809 is out of range of a long", 5),
    ("a = 123456789012345678901234567890", "is out of range of a long", 5),
    ("a = 1.2.3", "malformed number '1.2.'", 5),
    ("a = 12abc", "malformed number '12a'", 5),
    ("a = 1e", "malformed number '1e'", 5),
    ("i=10AND j=3", "malformed number '10A'", 3),
    ("a = .", "unexpected character '.'", 5),
    ('a = "x"', "unexpected character '\"'", 5),
    ("a = 1 /* comment */", "expected an expression, found '*'", 8),
    ("a = 0x1F", "malformed number '0x'", 5),
    ("a\u00a0= 1", "unexpected character '\\xa0'", 2),
    ("(" * 60 + "a" + ")" * 60, "selector nested more than 50 deep", 51),
    ("NOT " * 60 + "a", "selector nested more than 50 deep", 201),
    ("a = " + "-" * 60 + "b", "selector nested more than 50 deep", 55),
]


@pytest.mark.parametrize(("selector", "message", "column"), INVALID, ids=[c[0][:40] for c in INVALID])
def test_invalid_selector(selector: str, message: str, column: int) -> None:
    with pytest.raises(SelectorError) as caught:
        Selector(selector)
    assert message in str(caught.value)
    assert caught.value.column == column
    assert f"at column {column} of selector {selector!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("selector", ["", "   ", "\n\t"])
def test_empty_selector_selects_everything(selector: str) -> None:
    assert Selector(selector).matches(msg())


def test_nesting_within_the_limit_parses() -> None:
    assert select("(" * 50 + "a = 1" + ")" * 50, msg({"a": 1}))
    assert select("a = " + "-" * 25 + "1", msg({"a": -1}))


def test_long_chains_evaluate_without_recursion() -> None:
    terms = 2000  # twice the default recursion limit
    assert select(" + ".join(["1"] * terms) + f" = {terms}", msg())
    assert select(" OR ".join(["missing = 1"] * terms) + " OR TRUE", msg())
    assert not select(" AND ".join(["TRUE"] * terms) + " AND FALSE", msg())


def test_selector_keeps_its_source() -> None:
    selector = Selector("a = 1")
    assert selector.source == "a = 1"
    assert repr(selector) == "Selector('a = 1')"


def test_selector_refuses_a_non_string() -> None:
    with pytest.raises(SelectorError, match="must be a string, not int"):
        Selector(5)  # type: ignore[arg-type]


# -- from_message --------------------------------------------------------------------------------
def _message(*sections: Any) -> bytes:
    return b"".join(codec.encode(section) for section in sections)


def test_from_message_reads_header_properties_and_application_properties() -> None:
    payload = _message(
        Header(durable=True, priority=UByte(7)),
        MessageAnnotations({Symbol("x-opt-a"): 1}),
        Properties(
            message_id="ID:m1",
            correlation_id=ULong(9),
            subject="order",
            creation_time=Timestamp(1000),
            absolute_expiry_time=Timestamp(2000),
        ),
        ApplicationProperties({"colour": "red", "n": 3}),
        AmqpValue("body"),
    )
    fields = MessageFields.from_message(payload)
    assert fields == MessageFields(
        {"colour": "red", "n": 3},
        message_id="ID:m1",
        correlation_id=ULong(9),
        subject="order",
        priority=7,
        durable=True,
        creation_time=1000,
        absolute_expiry_time=2000,
    )
    assert select(
        "colour = 'red' AND n > 2 AND JMSPriority = 7 AND JMSDeliveryMode = 'PERSISTENT' AND JMSType = 'order'"
        " AND JMSMessageID = 'ID:m1' AND JMSCorrelationID = 'ID:AMQP_ULONG:9' AND JMSTimestamp = 1000",
        fields,
    )


def test_from_message_without_sections_gives_defaults() -> None:
    assert MessageFields.from_message(_message(Data(b"x"))) == MessageFields({})
    assert MessageFields.from_message(b"") == MessageFields({})
    header_only = MessageFields.from_message(_message(Header(), Data(b"x")))
    assert (header_only.priority, header_only.durable) == (4, False)


def test_from_message_never_decodes_the_body() -> None:
    head = _message(Header(priority=UByte(1)), ApplicationProperties({"k": "v"}))
    for body in (b"\x00\x53\x75\xb0\xff\xff\xff\xff", b"\x00\x53\x77\xfe", b"\x00\x53\x78"):
        fields = MessageFields.from_message(head + body)
        assert fields.priority == 1
        assert fields.application_properties == {"k": "v"}
    # without application-properties, decoding stops at the body's descriptor
    fields = MessageFields.from_message(_message(Properties(subject="s")) + b"\x00\x53\x75\xb0\xff\xff\xff\xff")
    assert fields.subject == "s"


def test_from_message_accepts_symbolic_descriptors() -> None:
    payload = codec.encode(Described(Symbol("amqp:application-properties:map"), {"k": 1})) + _message(Data(b""))
    assert MessageFields.from_message(payload).application_properties == {"k": 1}


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x53\x70\xc0\x02\x01\x41\x53",  # a header whose list runs past the end
        b"\x00\x53\x73\xc0\x07\x04\x40\x40\x40\xa3\x01x",  # properties whose subject is a symbol
        b"\x00\x53\x70\xc0\x02\x01\xa1",  # durable must be a boolean
        b"\x41",  # not a described section
        b"\x00",  # a bare constructor
        _message(Header(priority=UByte(9))) + b"\x00\x53\x74\xc1\x03\x02\xa1",  # broken application-properties
    ],
)
def test_from_message_of_a_malformed_message_gives_empty_fields(payload: bytes) -> None:
    assert MessageFields.from_message(payload) == MessageFields({})


@settings(deadline=None)
@given(st.binary(max_size=64))
def test_from_message_never_raises(payload: bytes) -> None:
    assert isinstance(MessageFields.from_message(payload), MessageFields)


@settings(deadline=None)
@given(st.binary(max_size=32))
def test_from_message_never_raises_after_a_valid_prefix(tail: bytes) -> None:
    prefix = _message(Header(priority=UByte(2)), Properties(subject="s"))
    assert isinstance(MessageFields.from_message(prefix + tail), MessageFields)


# -- the filter-set entry ------------------------------------------------------------------------
def test_selector_descriptors() -> None:
    assert Symbol("apache.org:selector-filter:string") in SELECTOR_DESCRIPTORS
    assert ULong(0x0000468C00000004) in SELECTOR_DESCRIPTORS
    assert len(SELECTOR_DESCRIPTORS) == 2


@pytest.mark.parametrize("descriptor", sorted(SELECTOR_DESCRIPTORS, key=str))
def test_selector_from_filter_both_descriptor_forms(descriptor: Any) -> None:
    filters = {
        Symbol("no-local"): Described(Symbol("apache.org:no-local-filter:list"), []),
        Symbol("jms-selector"): Described(descriptor, "colour = 'red'"),
    }
    # as the codec hands it to the broker, after a round trip over the wire
    decoded, _ = codec.decode(codec.encode(filters))
    found = selector_from_filter(decoded)
    assert found is not None
    key, selector = found
    assert key == Symbol("jms-selector")
    assert selector.source == "colour = 'red'"
    assert selector.matches(msg({"colour": "red"}))
    assert not selector.matches(msg({"colour": "blue"}))


@pytest.mark.parametrize(
    "filters",
    [
        None,
        {},
        {Symbol("no-local"): Described(Symbol("apache.org:no-local-filter:list"), [])},
        {Symbol("topic"): Described(ULong(0x0000468C00000001), "a.b")},  # legacy binding filter, not a selector
        {Symbol("plain"): "a = 1"},  # not described
        {Symbol("odd"): Described([1], "a = 1")},  # an unhashable descriptor
    ],
)
def test_selector_from_filter_without_a_selector(filters: dict[Any, Any] | None) -> None:
    assert selector_from_filter(filters) is None


def test_selector_from_filter_with_an_invalid_selector() -> None:
    with pytest.raises(SelectorError, match="unterminated string literal"):
        selector_from_filter({Symbol("jms-selector"): Described(ULong(0x0000468C00000004), "a = 'x")})


def test_selector_from_filter_with_a_non_string_selector() -> None:
    with pytest.raises(SelectorError, match="must hold a string, not int"):
        selector_from_filter({Symbol("jms-selector"): Described(Symbol("apache.org:selector-filter:string"), 5)})


# -- fuzzing ---------------------------------------------------------------------------------------
def _outcome(text: str) -> str:
    """ "parsed", or the SelectorError's message; any other exception fails the test."""
    try:
        Selector(text)
    except SelectorError as exc:
        return str(exc)
    return "parsed"


@settings(deadline=None)
@given(st.text(max_size=60))
def test_any_text_parses_or_raises_selector_error(text: str) -> None:
    assert _outcome(text)


TOKENS = [
    "a", "b", "JMSPriority", "JMSType", "1", "2.5", "-", "+", "*", "/", "=", "<>", "<", "<=", ">", ">=",
    "(", ")", ",", "'x'", "'%_'", "AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL",
    "TRUE", "FALSE", "'", "1e", ".", "9223372036854775808",
]  # fmt: skip


@settings(deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=25))
def test_token_soup_parses_or_raises_selector_error(tokens: list[str]) -> None:
    assert _outcome(" ".join(tokens))


# A generator of valid selectors, to fuzz evaluation.
_names = st.sampled_from(["a", "b", "c", "JMSPriority", "JMSType", "JMSMessageID", "JMSTimestamp"])
_numbers = st.one_of(
    st.integers(LONG_MIN, LONG_MAX).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "0.0", "1e308", "7."]),
)
_strings = st.text(max_size=5).map(lambda s: "'" + s.replace("'", "''") + "'")
_arithmetic = st.recursive(
    st.one_of(_names, _numbers),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from("+-*/"), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda x: f"-({x})"),
    ),
    max_leaves=6,
)
_values = st.one_of(_arithmetic, _strings, st.sampled_from(["TRUE", "FALSE"]))
_patterns = st.lists(st.sampled_from(["a", "b", "%", "_", "!%", "!_", "!!"]), max_size=6).map(
    lambda parts: "'" + "".join(parts) + "'"
)
_not = st.sampled_from(["", "NOT "])
_predicates = st.one_of(
    st.tuples(_arithmetic, st.sampled_from(["<", "<=", ">", ">="]), _arithmetic).map(" ".join),
    st.tuples(_values, st.sampled_from(["=", "<>"]), _values).map(" ".join),
    st.tuples(_arithmetic, _not, _arithmetic, _arithmetic).map(lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}"),
    st.tuples(_names, _not, st.lists(_strings, min_size=1, max_size=3)).map(
        lambda t: f"{t[0]} {t[1]}IN ({', '.join(t[2])})"
    ),
    st.tuples(_names, _not, _patterns, st.booleans()).map(
        lambda t: f"{t[0]} {t[1]}LIKE {t[2]}" + (" ESCAPE '!'" if t[3] else "")
    ),
    st.tuples(_values, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
    _names,
)
_conditions = st.recursive(
    _predicates,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda x: f"NOT ({x})"),
    ),
    max_leaves=5,
)
_property_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(LONG_MIN, LONG_MAX),
    st.floats(),
    st.text(max_size=5),
    st.binary(max_size=4),
    st.uuids(),
    st.lists(st.integers(), max_size=2),
    st.builds(Symbol, st.text(alphabet="ab%", max_size=3)),
)
_messages = st.builds(
    MessageFields,
    st.dictionaries(st.sampled_from(["a", "b", "c"]), _property_values, max_size=3),
    message_id=st.one_of(st.none(), st.text(max_size=5), st.uuids(), st.integers(0, 2**64 - 1), st.binary(max_size=3)),
    correlation_id=st.one_of(st.none(), st.text(max_size=5), st.integers(0, 2**64 - 1)),
    subject=st.one_of(st.none(), st.text(max_size=5)),
    priority=st.integers(0, 255),
    durable=st.booleans(),
    creation_time=st.one_of(st.none(), st.integers(LONG_MIN, LONG_MAX)),
)


@settings(deadline=None, max_examples=75)
@given(_conditions, _messages)
def test_evaluation_never_raises_and_is_three_valued(condition: str, message: MessageFields) -> None:
    selected = Selector(condition).matches(message)
    negated = Selector(f"NOT ({condition})").matches(message)
    assert isinstance(selected, bool)
    assert not (selected and negated)  # at most one of TRUE and FALSE
    # OR with its own negation is TRUE exactly when the condition is not UNKNOWN
    assert Selector(f"({condition}) OR NOT ({condition})").matches(message) is (selected or negated)
