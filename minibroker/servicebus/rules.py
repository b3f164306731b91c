"""Subscription rules (issue 17 items 2 and 6): SQL filters, correlation filters, and their AMQP encoding. Pure.

Theory of operation: a Service Bus subscription holds named rules; a message published to the topic goes to the
subscription when any rule's filter matches it. ``compile_rule(spec)`` turns a ``RuleSpec`` (entities.py) into a
``Rule`` whose ``matches(view)`` reads a ``MessageView``: the message's system properties (``sys.*``) and its
application-properties (``user.*``, or a bare name), decoded once per published message by ``MessageView.of``.

The SQL filter language is the subset of SQL-92 Service Bus documents ("Subscription Rule SQL Filter Syntax"):
``NOT``/``AND``/``OR``; ``=``, ``<>``, ``!=``, ``<``, ``<=``, ``>``, ``>=``; ``IS [NOT] NULL``;
``[NOT] IN (...)``; ``[NOT] LIKE pattern [ESCAPE 'c']``; ``EXISTS(property)``; ``+ - * / %`` and unary signs;
constants (integers, decimals, ``'strings'`` with ``''`` for a quote, ``TRUE``, ``FALSE``, ``NULL``);
properties ``[sys.|user.]name`` or ``[name with spaces]``. Keywords and system property names are
case-insensitive. Functions (``newid()``, ``property()``) are not supported: naming one is an error.

It is parsed by its own small recursive-descent parser, not by the JMS selector (``broker/selector.py``): that
one sits in the broker layer above this package, and the dialects differ in identifiers (scopes, brackets),
operators (``!=``, ``%``), ``EXISTS`` and NULL constants; what they share is the three-valued logic, written
here in a few lines. Invariants, fuzzed by tests/servicebus/test_rules_pure.py:

- ``compile_rule`` / ``parse_sql`` / ``parse_action`` either return or raise ``RuleError``, whatever the text;
- ``Rule.matches`` and running an action never raise: type mismatches, NULLs, division by zero give UNKNOWN,
  which matches nothing;
- nesting is bounded at parse time (``MAX_DEPTH``) and operator chains are evaluated in loops, so evaluation
  cannot run out of stack; an expression longer than ``max_length`` (the broker's ``max_selector_length``) is
  refused before parsing; ``LIKE`` matches without backtracking (fixed-width pieces found left to right).

A SQL rule action (``SET name = expression``, ``REMOVE name``, statements separated by ``;`` or blanks) changes
the application-properties of the subscription's copy of a message its filter matched (``Rule.action``, run by
the dispatcher; ``with_user_properties``); setting or removing a system property (``sys.``) is refused. When
several matching rules have actions, the subscription still gets one copy, with the actions run in rule order
(Service Bus makes a copy per matching rule).

AMQP encoding (``com.microsoft:add-rule`` / ``enumerate-rules``), as the JS SDK (``core/managementClient.ts``
``addRule`` / ``getRules``, ``util/constants.ts`` ``descriptorCodes``) and the .NET SDK
(``Amqp/AmqpMessageConverter.cs``, ``Amqp/Framing/Amqp*Codec.cs``) send and read them: add-rule's
``rule-description`` is a map with ``sql-filter`` (map: ``expression``), or ``correlation-filter`` (map:
``correlation-id``, ``message-id``, ``to``, ``reply-to``, ``label``, ``session-id``, ``reply-to-session-id``,
``content-type``, ``properties``), and optionally ``sql-rule-action``; enumerate-rules answers each rule as a
described list ``[filter, action, rule-name, created-at]`` whose filter and action are described lists too.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from minibroker.amqp import codec, sections
from minibroker.amqp.definitions import ApplicationProperties, Header, MessageAnnotations, Properties
from minibroker.amqp.types import DecodeError, Described, Int, Timestamp, ULong
from minibroker.servicebus.entities import DEFAULT_RULE, RuleSpec

__all__ = [
    "MAX_DEPTH",
    "MAX_RULES",
    "MessageView",
    "Rule",
    "RuleError",
    "compile_rule",
    "description_value",
    "parse_action",
    "parse_description",
    "parse_sql",
    "with_user_properties",
]

RULE_DESCRIPTION = ULong(0x0000013700000004)
SQL_FILTER = ULong(0x0000001370000006)
TRUE_FILTER = ULong(0x0000001370000007)
FALSE_FILTER = ULong(0x0000001370000008)
CORRELATION_FILTER = ULong(0x0000001370000009)
EMPTY_RULE_ACTION = ULong(0x0000013700000005)
SQL_RULE_ACTION = ULong(0x0000013700000006)
"""Descriptor codes (JS ``util/constants.ts`` ``descriptorCodes``; .NET ``Amqp*Codec.Code``)."""
COMPATIBILITY_LEVEL = 20
"""The SQL filter's compatibility level the SDKs send and expect (``CompatibilityLevel: 20``)."""

CORRELATION_FIELDS = (
    ("correlation_id", "correlation-id"),
    ("message_id", "message-id"),
    ("to", "to"),
    ("reply_to", "reply-to"),
    ("subject", "label"),
    ("session_id", "session-id"),
    ("reply_to_session_id", "reply-to-session-id"),
    ("content_type", "content-type"),
)
"""A correlation filter's fields: ``RuleSpec`` name, wire name; in the order of the described list."""
MAX_RULES = 2000
"""Rules a subscription may hold (Service Bus's quota)."""
MAX_DEPTH = 50
"""Nested parentheses, NOT and unary signs an expression may hold."""
DEFAULT_MAX_LENGTH = 4096
"""Characters of a SQL expression at most, unless the broker says otherwise (its ``max_selector_length``)."""
DEFAULT_MAX_SECTION = 64 * 1024
"""Bytes of a section (properties, application-properties, ...) a filter reads at most."""


class RuleError(ValueError):
    """An invalid rule: a SQL expression that does not parse, a malformed rule-description; ``str()`` says why."""


# -- what a filter reads ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MessageView:
    """The properties a rule reads of one message: ``system`` by lower-case ``sys.`` name, ``user`` by name."""

    system: Mapping[str, Any]
    user: Mapping[str, Any]

    @classmethod
    def of(
        cls, payload: bytes, limit: int | None = DEFAULT_MAX_SECTION, sequence_number: int | None = None
    ) -> MessageView:
        """Decode the header, message-annotations, properties and application-properties of ``payload``; a
        section longer than ``limit`` bytes is left out (its properties read as missing). ``sequence_number``:
        the broker's, when the payload carries none yet. Never raises."""
        try:
            view = _decode_view(payload, limit)
        except (DecodeError, IndexError, ValueError, TypeError):
            view = cls({}, {})
        if sequence_number is not None and view.system.get("sequencenumber") is None:
            view = cls({**view.system, "sequencenumber": sequence_number}, view.user)
        return view


def _decode_view(payload: bytes, limit: int | None) -> MessageView:
    system: dict[str, Any] = {}
    user: dict[str, Any] = {}
    for section in sections.walk(payload, last=sections.APPLICATION_PROPERTIES):
        if limit is not None and section.end - section.start > limit:
            continue
        decoded, _ = codec.decode(payload, section.start)
        if isinstance(decoded, Header):
            system["deliverycount"] = decoded.delivery_count or 0
            system["timetolive"] = decoded.ttl
        elif isinstance(decoded, MessageAnnotations) and isinstance(decoded.value, dict):
            for key, name in _ANNOTATIONS.items():
                if key in decoded.value:
                    system[name] = decoded.value[key]
        elif isinstance(decoded, Properties):
            for field_name, name in _PROPERTIES.items():
                system[name] = _identifier_text(getattr(decoded, field_name))
        elif isinstance(decoded, ApplicationProperties) and isinstance(decoded.value, dict):
            user = {str(k): v for k, v in decoded.value.items() if isinstance(k, str)}
    return MessageView(system, user)


_PROPERTIES = {
    "message_id": "messageid",
    "correlation_id": "correlationid",
    "subject": "label",
    "to": "to",
    "reply_to": "replyto",
    "group_id": "sessionid",
    "reply_to_group_id": "replytosessionid",
    "content_type": "contenttype",
    "absolute_expiry_time": "expiresatutc",
}
"""AMQP properties fields and the ``sys.`` names they answer."""
_ALIASES = {"subject": "label"}
"""``sys.`` names that are other names (``sys.Subject`` is ``sys.Label``, as the newer SDKs call it)."""
_ANNOTATIONS = {
    "x-opt-sequence-number": "sequencenumber",
    "x-opt-enqueued-time": "enqueuedtimeutc",
    "x-opt-scheduled-enqueue-time": "scheduledenqueuetimeutc",
    "x-opt-partition-key": "partitionkey",
}
SYSTEM_PROPERTIES = frozenset({*_PROPERTIES.values(), *_ANNOTATIONS.values(), "subject", "deliverycount", "timetolive"})
"""The ``sys.`` names a filter may read (lower-case); naming another is an error, as in Service Bus."""


def _identifier_text(value: Any) -> Any:
    """A message or correlation id as filters compare it: a uuid as its text, anything else as it is."""
    return str(value) if isinstance(value, uuid.UUID) else value


# -- values and three-valued logic --------------------------------------------------------------------
Evaluator = Callable[[MessageView], Any]
_NUMBER, _STRING, _BOOLEAN, _OTHER = 1, 2, 3, 4
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _kind(value: Any) -> int:
    if isinstance(value, bool):
        return _BOOLEAN
    if isinstance(value, int | float):
        return _NUMBER
    if isinstance(value, str):
        return _STRING
    return _OTHER


def _compare(op: str, a: Any, b: Any) -> bool | None:
    """``a op b``: None (UNKNOWN) for a NULL or values of different kinds; strings and booleans compare too."""
    if a is None or b is None:
        return None
    kind = _kind(a)
    if kind != _kind(b) or kind == _OTHER:
        return None
    if kind == _BOOLEAN and op not in ("=", "<>", "!="):
        return None
    if op == "=":
        return bool(a == b)
    if op in ("<>", "!="):
        return bool(a != b)
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _truth(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _arithmetic(op: str, a: Any, b: Any) -> Any:
    """``a op b`` on numbers (integer division and remainder truncate, as in C#); None for anything else."""
    if _kind(a) != _NUMBER or _kind(b) != _NUMBER:
        return None
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    elif b == 0:
        return None
    elif isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        result = quotient if op == "/" else a - quotient * b
    elif op == "/":
        result = a / b
    else:
        result = math.fmod(a, b) if math.isfinite(a) else math.nan  # (fmod of an infinity raises)
    if isinstance(result, int):
        return ((result - _LONG_MIN) % 2**64) + _LONG_MIN  # a C# long wraps
    return result


def _plus(value: Any) -> Any:
    return value if _kind(value) == _NUMBER else None


def _negate(value: Any) -> Any:
    return _arithmetic("*", value, -1) if _kind(value) == _NUMBER else None


# -- LIKE -----------------------------------------------------------------------------------------------
class _Like:
    """A LIKE pattern: ``%`` any run, ``_`` one character. Split at ``%`` into fixed-width pieces, each a regular
    expression of literals and ``.`` only; the first is anchored at the start, the last at the end, the others
    are found leftmost in between (the leftmost place is always as good as any later one), so matching never
    backtracks."""

    def __init__(self, pattern: str, escape: str | None) -> None:
        pieces: list[list[str]] = [[]]
        chars = iter(pattern)
        for char in chars:
            if escape is not None and char == escape:
                pieces[-1].append(re.escape(next(chars, escape)))
            elif char == "%":
                pieces.append([])
            elif char == "_":
                pieces[-1].append(".")
            else:
                pieces[-1].append(re.escape(char))
        self.widths = [len(p) for p in pieces]
        self.pieces = [re.compile("".join(p), re.DOTALL) for p in pieces]

    def matches(self, value: str) -> bool:
        if len(self.pieces) == 1:
            return self.pieces[0].fullmatch(value) is not None
        first, last = self.pieces[0], self.pieces[-1]
        start, end = self.widths[0], len(value) - self.widths[-1]
        if end < start or first.match(value) is None or last.match(value, end) is None:
            return False
        for piece in self.pieces[1:-1]:
            found = piece.search(value, start, end)
            if found is None:
                return False
            start = found.end()
        return True


# -- parsing --------------------------------------------------------------------------------------------
class _Token(NamedTuple):
    kind: str  # "name", "bracketed", "number", "string", "op", "end"
    value: str
    pos: int


_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<string>'(?:[^']|'')*')
      | (?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<bracketed>\[[^\]]*\])
      | (?P<op><>|!=|<=|>=|[=<>+\-*/%(),.;])""",
    re.VERBOSE,
)
_PARAMETER = re.compile(r"@[A-Za-z_][A-Za-z0-9_]*")
"""A SqlFilter/SqlRuleAction parameter reference (``SqlRuleFilter.Parameters`` in the .NET SDK): over AMQP neither
the JS SDK (``managementClient.ts`` ``addRule``) nor the .NET SDK (``AmqpMessageConverter.GetSqlRuleFilterMap``)
sends parameters, so one is refused by name."""
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE"})
_COMPARISONS = ("=", "<>", "!=", "<", "<=", ">", ">=")


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        found = _TOKEN.match(text, pos)
        if found is None:
            parameter = _PARAMETER.match(text, pos)
            if parameter is not None:
                raise RuleError(
                    f"SQL parameter {parameter.group()!r} at column {pos + 1} cannot be bound: the SDKs send a rule's "
                    "expression only, without parameters (put the value in the expression)"
                )
            raise RuleError(f"unexpected character {text[pos]!r} at column {pos + 1}")
        kind = found.lastgroup or ""
        if kind != "space":
            tokens.append(_Token(kind, found.group(), pos))
        pos = found.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    """Recursive descent over the grammar of the module docstring, compiling as it goes to closures."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def keyword(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "name" and token.value.upper() in words

    def op(self, *ops: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.value in ops

    def expect_op(self, op: str) -> None:
        if not self.op(op):
            raise self.error(f"expected {op!r}")
        self.advance()

    def error(self, reason: str) -> RuleError:
        token = self.peek()
        found = "the end" if token.kind == "end" else repr(token.value)
        return RuleError(f"{reason} at column {token.pos + 1}, found {found}")

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} deep")

    def parse(self) -> Evaluator:
        expr = self.or_expr()
        if self.peek().kind != "end":
            raise self.error("unexpected text")
        return expr

    def actions(self) -> list[tuple[str, Evaluator | None]]:
        """``(SET name = expression | REMOVE name) [;] ...``: (user property, value; None to remove) in order."""
        statements: list[tuple[str, Evaluator | None]] = []
        while self.peek().kind != "end":
            if not self.keyword("SET", "REMOVE"):
                raise self.error("expected SET or REMOVE")
            verb = self.advance().value.upper()
            scope, name = self.property()
            if scope == "sys":
                raise RuleError(f"a rule action may not change the system property sys.{name}")
            value: Evaluator | None = None
            if verb == "SET":
                self.expect_op("=")
                value = self.or_expr()
            statements.append((name, value))
            if self.op(";"):
                self.advance()
        if not statements:
            raise self.error("expected SET or REMOVE")
        return statements

    def chain(self, operand: Callable[[], Evaluator], words: tuple[str, ...], ops: tuple[str, ...]) -> Evaluator:
        """``operand (op operand)*``, left-associative, evaluated in a loop (no recursion per operator)."""
        first = operand()
        rest: list[tuple[str, Evaluator]] = []
        while self.keyword(*words) or self.op(*ops):
            op = self.advance().value.upper()
            rest.append((op, operand()))
        if not rest:
            return first
        if words:
            return _logical(words[0], [first, *(e for _, e in rest)])

        def arithmetic(view: MessageView) -> Any:
            value = first(view)
            for operator, evaluator in rest:
                value = _arithmetic(operator, value, evaluator(view))
            return value

        return arithmetic

    def or_expr(self) -> Evaluator:
        return self.chain(self.and_expr, ("OR",), ())

    def and_expr(self) -> Evaluator:
        return self.chain(self.not_expr, ("AND",), ())

    def not_expr(self) -> Evaluator:
        if self.keyword("NOT"):
            self.advance()
            self.nest()
            inner = self.not_expr()
            self.depth -= 1

            def negated(view: MessageView) -> Any:
                value = _truth(inner(view))
                return None if value is None else not value

            return negated
        return self.predicate()

    def predicate(self) -> Evaluator:
        left = self.sum()
        if self.op(*_COMPARISONS):
            op = self.advance().value
            right = self.sum()
            return lambda view: _compare(op, left(view), right(view))
        if self.keyword("IS"):
            self.advance()
            negated = self.keyword("NOT")
            if negated:
                self.advance()
            if not self.keyword("NULL"):
                raise self.error("expected NULL")
            self.advance()
            return lambda view: (left(view) is None) != negated
        negated = self.keyword("NOT")
        if negated:
            self.advance()
            if not self.keyword("IN", "LIKE"):
                raise self.error("expected IN or LIKE after NOT")
        if self.keyword("IN"):
            return _maybe_not(self.in_list(left), negated)
        if self.keyword("LIKE"):
            return _maybe_not(self.like(left), negated)
        return left

    def in_list(self, left: Evaluator) -> Evaluator:
        self.advance()
        self.expect_op("(")
        items = [self.sum()]
        while self.op(","):
            self.advance()
            items.append(self.sum())
        self.expect_op(")")

        def within(view: MessageView) -> bool | None:
            value = left(view)
            unknown = value is None
            for item in items:
                equal = _compare("=", value, item(view))
                if equal:
                    return True
                unknown = unknown or equal is None
            return None if unknown else False

        return within

    def like(self, left: Evaluator) -> Evaluator:
        self.advance()
        pattern = self.string("a pattern string after LIKE")
        escape = None
        if self.keyword("ESCAPE"):
            self.advance()
            escape = self.string("an escape string after ESCAPE")
            if len(escape) != 1:
                raise self.error("the ESCAPE string must be one character")
        matcher = _Like(pattern, escape)

        def like(view: MessageView) -> bool | None:
            value = left(view)
            return matcher.matches(value) if isinstance(value, str) else None

        return like

    def string(self, what: str) -> str:
        token = self.peek()
        if token.kind != "string":
            raise self.error(f"expected {what}")
        self.advance()
        return token.value[1:-1].replace("''", "'")

    def sum(self) -> Evaluator:
        return self.chain(self.product, (), ("+", "-"))

    def product(self) -> Evaluator:
        return self.chain(self.unary, (), ("*", "/", "%"))

    def unary(self) -> Evaluator:
        if self.op("+", "-"):
            sign = self.advance().value
            self.nest()
            inner = self.unary()
            self.depth -= 1
            if sign == "+":
                return lambda view: _plus(inner(view))
            return lambda view: _negate(inner(view))
        return self.primary()

    def primary(self) -> Evaluator:
        token = self.peek()
        if token.kind == "op" and token.value == "(":
            self.advance()
            self.nest()
            inner = self.or_expr()
            self.depth -= 1
            self.expect_op(")")
            return inner
        if token.kind == "string":
            text = self.string("a string")
            return lambda view: text
        if token.kind == "number":
            self.advance()
            number = _number(token.value)
            return lambda view: number
        if self.keyword("TRUE", "FALSE", "NULL"):
            self.advance()
            constant = {"TRUE": True, "FALSE": False, "NULL": None}[token.value.upper()]
            return lambda view: constant
        if self.keyword("EXISTS"):
            self.advance()
            self.expect_op("(")
            scope, name = self.property()
            self.expect_op(")")
            if scope == "sys":
                return lambda view: view.system.get(name) is not None
            return lambda view: name in view.user
        if token.kind in ("name", "bracketed"):
            scope, name = self.property()
            if scope == "sys":
                return lambda view: view.system.get(name)
            return lambda view: view.user.get(name)
        raise self.error("expected a value")

    def property(self) -> tuple[str, str]:
        """``[sys.|user.]name``: the scope and the name (a system name lower-cased, checked to exist)."""
        token = self.advance()
        if token.kind == "name" and token.value.upper() in _KEYWORDS:
            raise RuleError(f"keyword {token.value!r} where a property was expected at column {token.pos + 1}")
        if token.kind not in ("name", "bracketed"):
            raise RuleError(f"expected a property name at column {token.pos + 1}")
        if self.op("("):
            raise RuleError(f"unknown function {token.value!r} at column {token.pos + 1}")
        scope = "user"
        if token.kind == "name" and token.value.lower() in ("sys", "user") and self.op("."):
            scope = token.value.lower()
            self.advance()
            token = self.advance()
            if token.kind not in ("name", "bracketed"):
                raise RuleError(f"expected a property name after {scope}. at column {token.pos + 1}")
        name = token.value[1:-1] if token.kind == "bracketed" else token.value
        if scope == "sys":
            name = name.lower()
            if name not in SYSTEM_PROPERTIES:
                raise RuleError(f"unknown system property sys.{token.value} at column {token.pos + 1}")
            name = _ALIASES.get(name, name)
        return scope, name


def _number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            raise RuleError(f"number {text!r} out of range")
        return value
    number = int(text)
    if number > _LONG_MAX:
        raise RuleError(f"integer {text!r} out of range")
    return number


def _logical(op: str, operands: list[Evaluator]) -> Evaluator:
    """AND / OR of three-valued truths over ``operands``, in a loop."""
    decisive = op == "OR"  # the value that decides: TRUE for OR, FALSE for AND

    def logical(view: MessageView) -> bool | None:
        unknown = False
        for operand in operands:
            value = _truth(operand(view))
            if value is decisive:
                return decisive
            unknown = unknown or value is None
        return None if unknown else not decisive

    return logical


def _maybe_not(evaluator: Evaluator, negated: bool) -> Evaluator:
    if not negated:
        return evaluator

    def negation(view: MessageView) -> bool | None:
        value = evaluator(view)
        return None if value is None else not value

    return negation


def parse_sql(text: str, max_length: int | None = DEFAULT_MAX_LENGTH) -> Evaluator:
    """Compile a SQL filter expression; raises ``RuleError`` (only) when it is invalid or too long."""
    return _parser(text, max_length).parse()


Action = Callable[[MessageView], dict[str, Any]]
"""A compiled SQL rule action: the application-properties a message has once the action ran."""


def parse_action(text: str, max_length: int | None = DEFAULT_MAX_LENGTH) -> Action:
    """Compile a SQL rule action; raises ``RuleError`` (only) when it is invalid or too long. Each statement sees
    the properties as the statements before it left them; running one never raises."""
    statements = _parser(text, max_length).actions()

    def run(view: MessageView) -> dict[str, Any]:
        user = dict(view.user)
        for name, value in statements:
            if value is None:
                user.pop(name, None)
            else:
                user[name] = value(MessageView(view.system, user))
        return user

    return run


def _parser(text: str, max_length: int | None) -> _Parser:
    if not isinstance(text, str):
        raise RuleError("a SQL expression must be a string")
    if max_length is not None and len(text) > max_length:
        raise RuleError(f"SQL expression longer than {max_length} characters")
    return _Parser(text)


# -- rules ----------------------------------------------------------------------------------------------
RULE_NAME = "RuleName"
"""The application-property naming the rule whose action made a subscription's copy of a message
(learn.microsoft.com, Service Bus "Topic filters and actions": each rule with an action gives its own copy)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One compiled rule of a subscription."""

    spec: RuleSpec
    test: Evaluator
    action: Action | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def matches(self, view: MessageView) -> bool:
        """Whether the filter takes the message (UNKNOWN does not)."""
        return self.test(view) is True


def compile_rule(spec: RuleSpec, max_length: int | None = DEFAULT_MAX_LENGTH) -> Rule:
    """The rule ``spec`` describes, its filter and action compiled; ``RuleError`` when one is invalid."""
    action = parse_action(spec.sql_action, max_length) if spec.sql_action is not None else None
    if spec.correlation_filter is not None:
        return Rule(spec, _correlation(spec.correlation_filter), action)
    if spec.sql_filter is not None:
        return Rule(spec, parse_sql(spec.sql_filter, max_length), action)
    return Rule(spec, lambda view: True, action)


def with_user_properties(payload: bytes, pos: int, user: Mapping[str, Any]) -> bytes:
    """``payload`` from ``pos`` (where its properties section, or what follows, starts) with ``user`` as its
    application-properties, in place of those it had (a section made when there was none). ``DecodeError`` when
    the sections there do not decode (the broker refuses such messages on arrival)."""
    head = pos
    code, value = sections.section_at(payload, head)
    if code == sections.PROPERTIES:
        head = sections.section_end(payload, value)
        code, value = sections.section_at(payload, head)
    tail = sections.section_end(payload, value) if code == sections.APPLICATION_PROPERTIES else head
    return payload[pos:head] + codec.encode(ApplicationProperties(dict(user))) + payload[tail:]


def _correlation(fields: Mapping[str, Any]) -> Evaluator:
    """Every field set must equal the message's (ids compared as text); every listed property must equal."""
    wanted = [
        (_PROPERTIES_BY_FIELD[name], _identifier_text(fields[name]))
        for name, _ in CORRELATION_FIELDS
        if fields.get(name) is not None
    ]
    properties = fields.get("properties") or {}
    if not isinstance(properties, Mapping):
        raise RuleError("a correlation filter's properties must be a map")
    users = [(str(k), v) for k, v in properties.items()]
    if not wanted and not users:
        raise RuleError("a correlation filter must set at least one field or property")

    def correlation(view: MessageView) -> bool:
        for name, value in wanted:
            if view.system.get(name) != value:
                return False
        for key, value in users:
            if key not in view.user or not (_compare("=", view.user[key], value) or view.user[key] == value):
                return False
        return True

    return correlation


_PROPERTIES_BY_FIELD = {"subject": "label", **{f: f.replace("_", "") for f, _ in CORRELATION_FIELDS if f != "subject"}}


def default_rule() -> RuleSpec:
    """The ``$Default`` rule: the true filter."""
    return RuleSpec(DEFAULT_RULE)


# -- AMQP encoding --------------------------------------------------------------------------------------
def parse_description(name: Any, description: Any) -> RuleSpec:
    """The ``RuleSpec`` of an add-rule request's ``rule-name`` and ``rule-description`` (a map, or a described
    map); ``RuleError`` when a field is missing or of the wrong type, or the rule has an action."""
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > 50:
        raise RuleError("rule-name must be a string of 1 to 50 characters without NUL")
    description = _map(description, "rule-description")
    action = description.get("sql-rule-action")
    sql_action = None
    if action is not None:
        sql_action = _map(action, "sql-rule-action").get("expression")
        if not isinstance(sql_action, str):
            raise RuleError("sql-rule-action expression must be a string")
    sql, correlation = description.get("sql-filter"), description.get("correlation-filter")
    if (sql is None) == (correlation is None):
        raise RuleError("rule-description must hold one of sql-filter and correlation-filter")
    if sql is not None:
        expression = _map(sql, "sql-filter").get("expression")
        if not isinstance(expression, str):
            raise RuleError("sql-filter expression must be a string")
        return RuleSpec(name, sql_filter=expression, sql_action=sql_action)
    given = _map(correlation, "correlation-filter")
    fields: dict[str, Any] = {}
    for field_name, wire in CORRELATION_FIELDS:
        value = given.get(wire)
        if value is not None and not isinstance(value, str | uuid.UUID):
            raise RuleError(f"correlation-filter {wire} must be a string")
        fields[field_name] = value
    if given.get("properties") is not None:
        fields["properties"] = {str(k): v for k, v in _map(given["properties"], "properties").items()}
    return RuleSpec(name, correlation_filter=fields, sql_action=sql_action)


def _map(value: Any, what: str) -> dict[str, Any]:
    if isinstance(value, Described):
        value = value.value
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise RuleError(f"{what} must be a map with string keys")
    return {str(k): v for k, v in value.items()}


def description_value(spec: RuleSpec, created_ms: int) -> Described:
    """A rule as enumerate-rules answers it: ``rule-description`` (described list: filter, action, name,
    created-at), as the JS SDK's ``getRules`` and .NET's ``AmqpRuleDescriptionCodec`` read it."""
    if spec.correlation_filter is not None:
        fields = spec.correlation_filter
        values: list[Any] = [fields.get(name) for name, _ in CORRELATION_FIELDS]
        values.append(dict(fields.get("properties") or {}))
        rule_filter = Described(CORRELATION_FILTER, values)
    elif spec.sql_filter is not None:
        rule_filter = Described(SQL_FILTER, [spec.sql_filter, Int(COMPATIBILITY_LEVEL)])
    else:
        rule_filter = Described(TRUE_FILTER, [])
    action = (
        Described(SQL_RULE_ACTION, [spec.sql_action, Int(COMPATIBILITY_LEVEL)])
        if spec.sql_action is not None
        else Described(EMPTY_RULE_ACTION, [])
    )
    return Described(RULE_DESCRIPTION, [rule_filter, action, spec.name, Timestamp(created_ms)])
