"""The SQL filter language and correlation filters of Service Bus subscription rules (``servicebus/rules.py``),
pure: a table of expressions, a model-based check against a small independent oracle, fuzzing (parsing raises
only ``RuleError``, evaluating never raises), attacker-sized inputs, and the AMQP encoding of rules."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp.types import Described, Symbol, ULong
from minibroker.servicebus.entities import RuleSpec
from minibroker.servicebus.rules import (
    MAX_DEPTH,
    MessageView,
    RuleError,
    compile_rule,
    description_value,
    parse_action,
    parse_description,
    parse_sql,
    with_user_properties,
)

pytestmark = pytest.mark.timeout(60)

VIEW = MessageView(
    {"messageid": "m-1", "label": "orders", "to": "east", "contenttype": "application/json", "sequencenumber": 7},
    {"color": "red", "n": 5, "x": 2.5, "flag": True, "s": "50%_off", "nothing": None, "my prop": "spaced"},
)


def _sql(text: str, view: MessageView = VIEW) -> bool:
    return compile_rule(RuleSpec("r", sql_filter=text)).matches(view)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1=1", True),
        ("1=0", False),
        ("TRUE", True),
        ("false", False),
        ("color = 'red'", True),
        ("user.color = 'red'", True),
        ("color <> 'red'", False),
        ("color != 'blue'", True),
        ("sys.Label = 'orders'", True),
        ("SYS.LABEL = 'orders'", True),
        ("sys.Subject = 'orders'", True),
        ("sys.MessageId = 'm-1' AND sys.To = 'east'", True),
        ("sys.ContentType LIKE 'application/%'", True),
        ("sys.SequenceNumber >= 7", True),
        ("sys.CorrelationId IS NULL", True),
        ("EXISTS(sys.CorrelationId)", False),
        ("EXISTS(color) AND EXISTS(nothing)", True),
        ("EXISTS(missing)", False),
        ("missing IS NULL", True),
        ("nothing IS NULL", True),
        ("color IS NOT NULL", True),
        ("missing = 1", False),
        ("NOT missing = 1", False),  # UNKNOWN stays UNKNOWN
        ("missing = 1 OR 1 = 1", True),
        ("missing = 1 AND 1 = 0", False),
        ("n > 4 AND n < 6", True),
        ("n + 1 = 6", True),
        ("n * 2 - 1 = 9", True),
        ("n / 2 = 2", True),  # integer division
        ("n % 3 = 2", True),
        ("-n % 3 = -2", True),  # the sign of the dividend, as in C#
        ("x * 2 = 5.0", True),
        ("x > n", False),
        ("n / 0 = 1", False),
        ("n / 0 IS NULL", True),
        ("1 + 2 * 3 = 7", True),
        ("(1 + 2) * 3 = 9", True),
        ("- -n = 5", True),
        ("n IN (1, 5, 9)", True),
        ("n NOT IN (1, 5, 9)", False),
        ("color IN ('blue', 'red')", True),
        ("missing IN (1)", False),
        ("missing NOT IN (1)", False),
        ("s LIKE '50!%!_off' ESCAPE '!'", True),
        ("s LIKE '50%'", True),
        ("s LIKE '%off'", True),
        ("s LIKE '_0%o_f'", True),
        ("s NOT LIKE '%x%'", True),
        ("n LIKE '5'", False),
        ("flag = TRUE", True),
        ("flag", True),
        ("flag > FALSE", False),
        ("color = 5", False),
        ("color > 'qqq'", True),
        ("[my prop] = 'spaced'", True),
        ("user.[my prop] = 'spaced'", True),
        ("'it''s' = 'it''s'", True),
        ("color = NULL", False),
        ("1.5e1 = 15", True),
        ("not (color = 'blue') and (n = 5 or n = 6)", True),
    ],
)
def test_sql_filter(text: str, expected: bool) -> None:
    assert _sql(text) is expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "color =",
        "= 1",
        "color = 'red' extra",
        "(1 = 1",
        "1 = 1)",
        "'unterminated",
        "color LIKE 5",
        "color LIKE 'a' ESCAPE 'ab'",
        "newid() = 'x'",
        "property('a') = 1",
        "sys.NotAProperty = 1",
        "sys.",
        "user.",
        "EXISTS(1)",
        "EXISTS(AND)",
        "color IS 5",
        "color NOT BETWEEN 1 AND 2",
        "color IN ()",
        "a = 1 ; DROP TABLE x",
        "a = 99999999999999999999",
        "a = 1e999",
        "#",
        "\x00",
    ],
)
def test_invalid_sql_is_rule_error(text: str) -> None:
    with pytest.raises(RuleError):
        parse_sql(text)


def test_numeric_edges_never_raise() -> None:
    """Infinities, NaN and the 64-bit edges: C# long arithmetic wraps; nothing raises."""
    view = MessageView({}, {"inf": float("inf"), "nan": float("nan"), "low": -(2**63), "top": 2**64 - 1})
    assert _sql("inf % 1 IS NULL", view) is False  # NaN, a number
    assert _sql("NOT (nan = nan)", view) is True
    assert _sql("-low = low", view) is True  # wraps, as in C#
    assert _sql("low / -1 = low", view) is True
    assert _sql("top * 2 < 0", view) is True
    assert _sql("inf - inf = 0", view) is False


def test_length_and_depth_are_bounded() -> None:
    long = "a = 1 OR " * 1000 + "1=1"
    with pytest.raises(RuleError, match="longer than 4096"):
        parse_sql(long)
    assert parse_sql(long, max_length=None)(VIEW) is True  # a long chain evaluates in a loop, not by recursion
    parse_sql("(" * MAX_DEPTH + "1=1" + ")" * MAX_DEPTH)
    for deep in ("(" * (MAX_DEPTH + 1) + "1=1" + ")" * (MAX_DEPTH + 1), "NOT " * 51 + "1=1", "-" * 51 + "1 = 1"):
        with pytest.raises(RuleError, match="nested"):
            parse_sql(deep)


def test_like_never_backtracks() -> None:
    """A pattern of many ``%a`` against a long run of ``a`` without the final letter: linear, not exponential."""
    pattern = "%a" * 1000 + "%b"
    view = MessageView({}, {"s": "a" * 60_000})
    started = time.perf_counter()
    assert parse_sql(f"s LIKE '{pattern}'", max_length=None)(view) is False
    assert time.perf_counter() - started < 5


# -- a model: random expressions, evaluated by the rules and by an oracle written on the tree -------------
_NAMES = ("a", "b", "c")
_VALUES = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["x", "y", "x%"]), st.booleans())


def _leaf() -> st.SearchStrategy[tuple[Any, ...]]:
    operand = st.one_of(st.tuples(st.just("prop"), st.sampled_from(_NAMES)), st.tuples(st.just("const"), _VALUES))
    return st.one_of(
        st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", ">="]), operand, operand),
        st.tuples(st.just("isnull"), st.sampled_from(_NAMES), st.booleans()),
        st.tuples(st.just("exists"), st.sampled_from(_NAMES)),
        st.tuples(st.just("like"), st.sampled_from(_NAMES), st.sampled_from(["x%", "%", "_", "x\\%", "%y"])),
    )


_EXPR = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
    ),
    max_leaves=12,
)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def _render(e: tuple[Any, ...]) -> str:
    kind = e[0]
    if kind == "cmp":
        sides = [s[1] if s[0] == "prop" else _literal(s[1]) for s in e[2:]]
        return f"({sides[0]} {e[1]} {sides[1]})"
    if kind == "isnull":
        return f"({e[1]} IS {'NOT ' if e[2] else ''}NULL)"
    if kind == "exists":
        return f"EXISTS({e[1]})"
    if kind == "like":
        return f"({e[1]} LIKE '{e[2]}' ESCAPE '\\')"
    if kind == "not":
        return f"(NOT {_render(e[1])})"
    return f"({_render(e[1])} {kind.upper()} {_render(e[2])})"


def _oracle(e: tuple[Any, ...], props: dict[str, Any]) -> bool | None:
    """Three-valued SQL truth of ``e``, from the definitions (independent of the parser and its closures)."""
    kind = e[0]
    if kind == "cmp":
        a, b = (props.get(s[1]) if s[0] == "prop" else s[1] for s in e[2:])
        if a is None or b is None:
            return None
        groups = [type(v) if not isinstance(v, bool) else "bool" for v in (a, b)]
        if groups[0] != groups[1] or (groups[0] == "bool" and e[1] not in ("=", "<>")):
            return None
        return bool({"=": a == b, "<>": a != b, "<": a < b, ">=": a >= b}[e[1]])
    if kind == "isnull":
        return (props.get(e[1]) is None) is not e[2]
    if kind == "exists":
        return e[1] in props
    if kind == "like":
        value = props.get(e[1])
        if not isinstance(value, str):
            return None
        return re.fullmatch(_like_regex(e[2]), value, re.DOTALL) is not None
    if kind == "not":
        inner = _oracle(e[1], props)
        return None if inner is None else not inner
    left, right = _oracle(e[1], props), _oracle(e[2], props)
    if kind == "and":
        if left is False or right is False:
            return False
        return None if left is None or right is None else True
    if left is True or right is True:
        return True
    return None if left is None or right is None else False


def _like_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return "".join(out)


@settings(max_examples=400, deadline=None)
@given(_EXPR, st.dictionaries(st.sampled_from(_NAMES), _VALUES))
def test_sql_agrees_with_oracle(expr: tuple[Any, ...], props: dict[str, Any]) -> None:
    text = _render(expr)
    assert _sql(text, MessageView({}, props)) is (_oracle(expr, props) is True), text


# -- fuzzing -----------------------------------------------------------------------------------------------
_SQLISH = st.lists(
    st.sampled_from(
        [
            *"abn.sy%_'()[]!=<>+-*/,0123456789 \x00é",
            "AND ",
            "OR ",
            "NOT ",
            " IN ",
            " LIKE ",
            " IS ",
            "NULL",
            "EXISTS",
            " ESCAPE ",
            "sys.",
            "user.",
            "TRUE",
            "sys.Label",
            "sys.SequenceNumber",
        ]
    ),
    max_size=40,
).map("".join)
_ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=4), st.uuids()
)


@settings(max_examples=600, deadline=None)
@given(st.one_of(_SQLISH, st.text(max_size=40)), st.dictionaries(st.sampled_from(["a", "b", "n", "s"]), _ANY_VALUE))
def test_parse_raises_only_rule_error_and_evaluation_never_raises(text: str, props: dict[str, Any]) -> None:
    try:
        evaluate = parse_sql(text)
    except RuleError:
        return
    result = evaluate(MessageView({"label": "x", "sequencenumber": 3}, props))
    assert result is None or isinstance(result, bool | int | float | str | bytes | uuid.UUID)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_view_of_garbage_never_raises(payload: bytes) -> None:
    MessageView.of(payload)


def test_view_of_a_message() -> None:
    message_id = uuid.uuid4()
    payload = (
        codec.encode(Header(delivery_count=2))
        + codec.encode(MessageAnnotations({Symbol("x-opt-sequence-number"): 9}))
        + codec.encode(
            Properties(message_id=message_id, subject="s", reply_to="r", group_id="g", content_type=Symbol("t/p"))
        )
        + codec.encode(ApplicationProperties({"k": "v"}))
        + codec.encode(AmqpValue("body"))
    )
    view = MessageView.of(payload)
    assert view.user == {"k": "v"}
    assert view.system["messageid"] == str(message_id)
    assert (view.system["label"], view.system["replyto"], view.system["sessionid"]) == ("s", "r", "g")
    assert (view.system["contenttype"], view.system["deliverycount"], view.system["sequencenumber"]) == ("t/p", 2, 9)
    assert MessageView.of(payload, limit=4).user == {}  # sections over the limit are not read
    assert MessageView.of(codec.encode(AmqpValue("b")), sequence_number=4).system["sequencenumber"] == 4


# -- correlation filters -----------------------------------------------------------------------------
def test_correlation_filter() -> None:
    rule = compile_rule(
        RuleSpec("c", correlation_filter={"subject": "orders", "to": "east", "properties": {"color": "red", "n": 5}})
    )
    assert rule.matches(VIEW)
    for system, user in (
        ({"label": "orders", "to": "west"}, {"color": "red", "n": 5}),
        ({"label": "orders", "to": "east"}, {"color": "red"}),
        ({"label": "orders", "to": "east"}, {"color": "red", "n": 6}),
        ({"to": "east"}, {"color": "red", "n": 5}),
    ):
        assert not rule.matches(MessageView(system, user))
    by_id = compile_rule(RuleSpec("i", correlation_filter={"message_id": "m-1"}))
    assert by_id.matches(VIEW)
    with pytest.raises(RuleError):
        compile_rule(RuleSpec("e", correlation_filter={}))


# -- encoding ----------------------------------------------------------------------------------------------
def _roundtrip(value: Any) -> Any:
    return codec.decode(codec.encode(AmqpValue(value)))[0].value


def test_description_roundtrips_through_the_codec() -> None:
    sql = _roundtrip(description_value(RuleSpec("s", sql_filter="a = 1"), 1000))
    assert isinstance(sql, Described)
    assert sql.descriptor == ULong(0x0000013700000004)
    assert sql.value[0].value[0] == "a = 1"
    assert sql.value[2] == "s"
    assert sql.value[3] == 1000
    action = _roundtrip(description_value(RuleSpec("s", sql_filter="1=1", sql_action="SET a = 1"), 0)).value[1]
    assert (action.descriptor, action.value[0]) == (ULong(0x0000013700000006), "SET a = 1")


def test_parse_description() -> None:
    assert parse_description("r", {"sql-filter": {"expression": "a=1"}}) == RuleSpec("r", sql_filter="a=1")
    described = Described(ULong(0x0000001370000006), {"expression": "a=1"})
    assert parse_description("r", {"sql-filter": described}).sql_filter == "a=1"
    spec = parse_description("r", {"correlation-filter": {"label": "x", "properties": {"k": 1}}})
    assert spec.correlation_filter is not None
    assert spec.correlation_filter["subject"] == "x"
    assert spec.correlation_filter["properties"] == {"k": 1}
    for name, description in (
        ("r\x00", {"sql-filter": {"expression": "1=1"}}),
        ("r", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": 1}}),
        ("r", {1: 2}),
        ("r", [1]),
        ("r", {"correlation-filter": {"to": b"x"}}),
    ):
        with pytest.raises(RuleError):
            parse_description(name, description)
    with_action = parse_description(
        "r", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": "REMOVE a"}}
    )
    assert with_action.sql_action == "REMOVE a"


# -- actions -------------------------------------------------------------------------------------------
def test_actions_run_in_order_on_user_properties() -> None:
    run = parse_action("SET n = n + 1; SET tag = 'xy' REMOVE color; set [my prop] = n * 2; REMOVE missing")
    assert run(VIEW) == {"n": 6, "x": 2.5, "flag": True, "s": "50%_off", "nothing": None, "my prop": 12, "tag": "xy"}
    assert VIEW.user["n"] == 5  # the view is left as it was


@pytest.mark.parametrize(
    "text",
    [
        "",
        ";",
        "SET",
        "SET a",
        "SET a 1",
        "REMOVE",
        "DELETE a",
        "SET sys.Label = 'x'",
        "REMOVE sys.To",
        "SET a = newid()",
        "SET a = (",
        "SET a = 1 SET",
    ],
)
def test_invalid_action_is_rule_error(text: str) -> None:
    with pytest.raises(RuleError):
        parse_action(text)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(_SQLISH.map(lambda t: "SET a = " + t), _SQLISH.map(lambda t: "REMOVE " + t), st.text(max_size=30)),
    st.dictionaries(st.sampled_from(["a", "b", "n", "s"]), _ANY_VALUE),
)
def test_action_parse_raises_only_rule_error_and_running_never_raises(text: str, props: dict[str, Any]) -> None:
    try:
        run = parse_action(text)
    except RuleError:
        return
    assert isinstance(run(MessageView({}, props)), dict)


def test_with_user_properties_replaces_the_section() -> None:
    properties = codec.encode(Properties(message_id="m"))
    body = codec.encode(AmqpValue("body"))
    for application in (b"", codec.encode(ApplicationProperties({"old": 1, "keep": "k"}))):
        rewritten = with_user_properties(properties + application + body, 0, {"keep": "k", "new": 2})
        assert rewritten == properties + codec.encode(ApplicationProperties({"keep": "k", "new": 2})) + body
    assert with_user_properties(body, 0, {}) == codec.encode(ApplicationProperties({})) + body
