"""JMS message selectors (JMS 2.0 §3.8.1) evaluated against AMQP messages.

Theory of operation: Qpid JMS and ActiveMQ/Artemis clients put a JMS selector in a receiver's source
filter-set as a described string, descriptor ``apache.org:selector-filter:string`` (0x0000468C:0x00000004).
``Selector(text)`` tokenizes and parses it once by recursive descent, checks what can be checked before
any message arrives (an operand of AND must be boolean, arithmetic needs numbers, ...), and compiles it
to a tree of closures, each taking a ``MessageFields`` and returning a value. Evaluation per message is
then a few closure calls with no parsing and no allocation beyond the values themselves.

Values while evaluating: ``None`` is SQL NULL (a missing property) and also UNKNOWN, the third truth
value; ``True``/``False`` are booleans; Python ``int``/``float`` (bool excluded) are the JMS exact and
approximate numerics; ``str`` (and its AMQP subclasses symbol and char) are strings; anything else (binary,
uuid, lists, maps) compares equal to nothing. Invariants, fuzzed by the tests:

- ``Selector(text)`` either returns or raises ``SelectorError``, whatever the text;
- ``Selector.matches`` never raises, whatever the message holds: type mismatches, NULLs, division by
  zero and overflow all give UNKNOWN (or FALSE where the specification says so), never an exception;
- nesting is bounded at parse time and AND/OR/+/-/*// chains are evaluated in loops, so evaluation
  cannot run out of stack.

Cost, whatever a peer sends (issue 12): a selector longer than ``max_length`` is refused before parsing;
``MessageFields.from_message`` decodes a section only when it is at most ``max_properties_size`` bytes
(a message with a larger one is not selected by a selector that reads it), so no value a selector reads is
longer than that; ``LIKE`` never backtracks (see "LIKE" below). The broker sets both limits from
``[broker] max_selector_length`` and ``max_selector_properties_size``.

Deliberately not supported (not JMS 2.0): ActiveMQ's hex/octal literals, double-quoted identifiers,
``--`` comments, a NULL literal outside ``IS [NOT] NULL``, and numeric IN lists.
"""

from __future__ import annotations

import collections
import functools
import itertools
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from minibroker.amqp import codec, sections
from minibroker.amqp.definitions import ApplicationProperties, Header, Properties
from minibroker.amqp.types import DecodeError, Described, Symbol, ULong

__all__ = [
    "APPLICATION_PROPERTIES",
    "DEFAULT_MAX_PROPERTIES_SIZE",
    "HEADER",
    "PROPERTIES",
    "SELECTOR_DESCRIPTORS",
    "MessageFields",
    "Selector",
    "SelectorError",
    "selector_from_filter",
]

SELECTOR_DESCRIPTORS: frozenset[Any] = frozenset(
    {Symbol("apache.org:selector-filter:string"), ULong(0x0000468C00000004)}
)
"""The descriptor of a JMS selector filter, by name and by code (AMQP filters registry)."""


class SelectorError(ValueError):
    """An invalid selector; ``str()`` says what is wrong and where (a 1-based column)."""

    def __init__(self, reason: str, text: str | None = None, position: int | None = None) -> None:
        self.reason = reason
        self.text = text
        self.column = None if position is None else position + 1
        if text is None or position is None:
            super().__init__(reason)
        else:
            super().__init__(f"{reason} at column {position + 1} of selector {text!r}")


# -- what a selector reads --------------------------------------------------------------------------
HEADER, PROPERTIES, APPLICATION_PROPERTIES = 1, 2, 4
"""Bits of ``MessageFields.oversized``: the sections a selector may read."""
DEFAULT_MAX_PROPERTIES_SIZE = 64 * 1024
"""Bytes of one section (header, properties, application-properties) a selector reads at most."""


@dataclass(frozen=True, slots=True)
class MessageFields:
    """The parts of a message a selector may read; built once per message by the broker."""

    application_properties: Mapping[str, Any]
    message_id: Any = None
    correlation_id: Any = None
    subject: str | None = None
    priority: int = 4
    durable: bool = False
    creation_time: int | None = None
    absolute_expiry_time: int | None = None
    oversized: int = 0
    """The sections (``HEADER | PROPERTIES | APPLICATION_PROPERTIES``) larger than the limit, left undecoded:
    a selector that reads a field of one of them does not select the message."""
    limit: int | None = field(default=None, compare=False)
    """The section size limit these fields were read with (None: none)."""

    @classmethod
    def from_message(cls, payload: bytes, limit: int | None = DEFAULT_MAX_PROPERTIES_SIZE) -> MessageFields:
        """Decode the header, properties and application-properties of an encoded message.

        Sections are found by their encoded sizes, without decoding what lies between them; each of the three
        is decoded only when it is at most ``limit`` bytes (None: any size), else its bit is set in
        ``oversized``. The annotations are never decoded, and neither is the body: reading stops at the first
        section that is none of header, delivery-annotations, message-annotations, properties or
        application-properties, or at the first value that is no section (``amqp.sections``). A message whose
        sections do not decode gives empty fields; this never raises.
        """
        try:
            return _decode_fields(cls, payload, limit)
        except (DecodeError, IndexError, ValueError):
            return cls({}, limit=limit)


_SECTION_BITS: dict[int, int] = {
    sections.HEADER: HEADER,
    sections.PROPERTIES: PROPERTIES,
    sections.APPLICATION_PROPERTIES: APPLICATION_PROPERTIES,
}


def _decode_fields(cls: type[MessageFields], payload: bytes, limit: int | None) -> MessageFields:
    header: Header | None = None
    properties: Properties | None = None
    application_properties: dict[Any, Any] = {}
    oversized = 0
    # §3.2: only the body and the footer come after application-properties: the walk stops there
    for section in sections.walk(payload, last=sections.APPLICATION_PROPERTIES):
        bit = _SECTION_BITS.get(section.code, 0)
        if not bit:
            continue  # the annotations: skipped by their size
        if limit is not None and section.end - section.start > limit:
            oversized |= bit
            continue
        decoded, _ = codec.decode(payload, section.start)
        if isinstance(decoded, Header):
            header = decoded
        elif isinstance(decoded, Properties):
            properties = decoded
        elif isinstance(decoded, ApplicationProperties):
            application_properties = decoded.value
    fields: dict[str, Any] = {}
    if header is not None:
        if header.priority is not None:
            fields["priority"] = header.priority
        fields["durable"] = header.durable is True
    if properties is not None:
        fields["message_id"] = properties.message_id
        fields["correlation_id"] = properties.correlation_id
        fields["subject"] = properties.subject
        fields["creation_time"] = properties.creation_time
        fields["absolute_expiry_time"] = properties.absolute_expiry_time
    return cls(application_properties, oversized=oversized, limit=limit, **fields)


# -- JMS header fields (AMQP JMS Mapping §3.2.1) -----------------------------------------------------
_JMS_ID_PREFIX = "ID:"
_AMQP_ID_ENCODINGS = ("AMQP_NO_PREFIX:", "AMQP_STRING:", "AMQP_UUID:", "AMQP_ULONG:", "AMQP_BINARY:")


def _jms_id(value: Any, *, message_id: bool) -> str | None:
    """A message-id or correlation-id as a JMS client renders it (AMQP JMS Mapping §3.2.1.1)."""
    if isinstance(value, str):
        if not value.startswith(_JMS_ID_PREFIX):
            # a JMSMessageID always starts "ID:"; an application's JMSCorrelationID string is kept as sent
            return f"ID:AMQP_NO_PREFIX:{value}" if message_id else str(value)
        if value.startswith(_AMQP_ID_ENCODINGS, len(_JMS_ID_PREFIX)):
            return f"ID:AMQP_STRING:{value}"
        return str(value)
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"ID:AMQP_ULONG:{int(value)}"  # int(): an AMQP ULong formats as "ULong(n)"
    if isinstance(value, bytes):
        return f"ID:AMQP_BINARY:{value.hex().upper()}"
    return None


def _jms_message_id(m: MessageFields) -> Any:
    return _jms_id(m.message_id, message_id=True)


def _jms_correlation_id(m: MessageFields) -> Any:
    return _jms_id(m.correlation_id, message_id=False)


def _jms_priority(m: MessageFields) -> Any:
    return m.priority


def _jms_delivery_mode(m: MessageFields) -> Any:
    return "PERSISTENT" if m.durable is True else "NON_PERSISTENT"


def _jms_timestamp(m: MessageFields) -> Any:
    # JMS getJMSTimestamp() is a long: 0 when the producer set none
    return 0 if m.creation_time is None else m.creation_time


def _jms_type(m: MessageFields) -> Any:
    return m.subject


def _jms_expiration(m: MessageFields) -> Any:
    # JMS getJMSExpiration() is a long: 0 means the message never expires
    return 0 if m.absolute_expiry_time is None else m.absolute_expiry_time


_HEADER_FIELDS: dict[str, Callable[[MessageFields], Any]] = {
    "JMSMessageID": _jms_message_id,
    "JMSCorrelationID": _jms_correlation_id,
    "JMSPriority": _jms_priority,
    "JMSDeliveryMode": _jms_delivery_mode,
    "JMSTimestamp": _jms_timestamp,
    "JMSType": _jms_type,
    "JMSExpiration": _jms_expiration,
}
_HEADER_FIELD_SECTIONS = {"JMSPriority": HEADER, "JMSDeliveryMode": HEADER}  # the others are in properties


# -- runtime values and three-valued logic -----------------------------------------------------------
Evaluator = Callable[[MessageFields], Any]

_K_OTHER, _K_NUM, _K_STR, _K_BOOL = 0, 1, 2, 3
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def _kind(value: Any) -> int:
    t = type(value)
    if t is str:
        return _K_STR
    if t is bool:
        return _K_BOOL
    if t is int or t is float or isinstance(value, int | float):
        return _K_NUM
    if isinstance(value, str):
        return _K_STR
    return _K_OTHER


def _is_number(value: Any) -> bool:
    return type(value) is not bool and isinstance(value, int | float)


def _wrap_long(n: int) -> int:
    """Java long arithmetic: wrap to 64-bit two's complement."""
    if _LONG_MIN <= n <= _LONG_MAX:
        return n
    return ((n - _LONG_MIN) & 0xFFFFFFFFFFFFFFFF) + _LONG_MIN


def _truth(value: Any) -> bool | None:
    """A value in a boolean context: a boolean stays itself; NULL and any other type are UNKNOWN."""
    return value if type(value) is bool else None


def _equal(a: Any, b: Any) -> bool | None:
    # §3.8.1.2: only like types compare (exact and approximate numerics are alike); unlike types give
    # FALSE; a NULL operand gives UNKNOWN
    if a is None or b is None:
        return None
    kind = _kind(a)
    if kind != _kind(b) or kind == _K_OTHER:
        return False
    return bool(a == b)


def _not_equal(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    kind = _kind(a)
    if kind != _kind(b) or kind == _K_OTHER:
        return False
    return bool(a != b)


def _ordering(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool | None]:
    # §3.8.1.2: string and boolean comparison is restricted to = and <>, so only numbers order
    def op(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        if _is_number(a) and _is_number(b):
            return bool(compare(a, b))
        return False

    return op


_COMPARISONS: dict[str, Callable[[Any, Any], bool | None]] = {
    "=": _equal,
    "<>": _not_equal,
    "<": _ordering(lambda a, b: a < b),
    "<=": _ordering(lambda a, b: a <= b),
    ">": _ordering(lambda a, b: a > b),
    ">=": _ordering(lambda a, b: a >= b),
}


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _add(a: Any, b: Any) -> Any:
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) + float(b)
    return _wrap_long(a + b)


def _subtract(a: Any, b: Any) -> Any:
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) - float(b)
    return _wrap_long(a - b)


def _multiply(a: Any, b: Any) -> Any:
    if not (_is_number(a) and _is_number(b)):
        return None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) * float(b)
    return _wrap_long(a * b)


def _divide(a: Any, b: Any) -> Any:
    if not (_is_number(a) and _is_number(b)) or b == 0:
        return None  # division by zero is UNKNOWN, for longs and doubles alike
    if isinstance(a, float) or isinstance(b, float):
        return float(a) / float(b)
    quotient = abs(a) // abs(b)  # Java truncates toward zero
    return _wrap_long(-quotient if (a < 0) != (b < 0) else quotient)


def _plus(value: Any) -> Any:
    return value if _is_number(value) else None


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {"+": _add, "-": _subtract, "*": _multiply, "/": _divide}


def _negate(value: Any) -> Any:
    if not _is_number(value):
        return None
    return -value if isinstance(value, float) else _wrap_long(-value)


# -- LIKE ------------------------------------------------------------------------------------------
# A LIKE pattern is matched in time linear in the value for a given pattern, never by backtracking (issue 12: a
# regex took 16 s for a 30 kB pattern against a 1 MB string). The pattern is split at its %s into segments of
# fixed length, made of literal characters and _ (any one character). The first segment must match at the
# start, the last at the end, and each middle one is placed leftmost after the one before: leftmost is always
# safe (a later placement never leaves more room for the rest), so nothing is ever retried.
#
# Placing an all-literal segment is one ``str.find`` (linear: CPython uses two-way search for long needles).
# A segment with _ is searched bit-parallel over the whole value at once (shift-and, turned around): for each
# character c it names, a big integer with bit i set where value[i] is c (``_Positions``); the starts where
# the segment matches are the AND of those bitsets, each shifted right by where c sits in the segment. Every
# step is one big-integer operation on len(value) bits, done in C; the number of steps depends on the pattern
# only (runs of one character are combined by doubling, and so are equally spaced repeats of one run). So
# the Python-level work is O(len(pattern)) whatever the value, and the C-level work O(len(pattern) x
# len(value) / 30) at worst. The broker bounds both factors (``max_selector_length`` and
# ``max_selector_properties_size``).
_NUL = itertools.repeat("\x00").__next__
_SPARSE_EVERY = 8  # after 1, 2, 4 and every 8 steps: are the possible starts few enough to try one by one?
_SPARSE_SLACK = 64


@functools.cache
def _bit_plane(bit: int) -> bytes:
    """A ``bytes.translate`` table: each byte becomes ASCII 1 if it has ``bit`` set, else ASCII 0."""
    return bytes(0x31 if octet >> bit & 1 else 0x30 for octet in range(256))


class _Alphabet:
    """The characters that the _-segments of a pattern name, numbered from 1 (``codes``, for ``str.translate``)."""

    __slots__ = ("codes", "width")

    def __init__(self, chars: str) -> None:
        self.codes = {ord(char): chr(code) for code, char in enumerate(dict.fromkeys(chars), 1)}
        self.width = len(self.codes).bit_length()  # bits of the largest code


class _Positions:
    """Where the characters of a pattern's alphabet occur in one value, as bitsets (bit i: position i).

    One ``str.translate`` maps the value onto the alphabet's codes (0 for any other character). Each bit of
    the codes then gives one bitset, a "plane" (one ``bytes.translate`` and one ``int(..., 2)`` of the
    reversed bytes, since ``int`` reads the most significant digit first). A character's bitset is the AND of
    the planes, or of their complements, that its code spells. All of it is C-level work linear in the value,
    done on first use and only for the values a _-segment is searched in.
    """

    __slots__ = ("_alphabet", "_cache", "_planes", "_value")

    def __init__(self, value: str, alphabet: _Alphabet) -> None:
        self._value = value
        self._alphabet = alphabet
        self._planes: list[int] | None = None
        self._cache: dict[tuple[str, int, int, int], int] = {}

    def _make_planes(self) -> list[int]:
        alphabet = self._alphabet
        compact = self._value.translate(collections.defaultdict(_NUL, alphabet.codes))[::-1]
        width = alphabet.width
        if width <= 8:
            lanes = [compact.encode("latin-1")]
        elif width <= 15:  # codes below 0x8000: no surrogates
            raw = compact.encode("utf-16-le")
            lanes = [raw[0::2], raw[1::2]]
        else:
            raw = compact.encode("utf-32-le", "surrogatepass")
            lanes = [raw[0::4], raw[1::4], raw[2::4]]
        return [int(lanes[bit >> 3].translate(_bit_plane(bit & 7)), 2) for bit in range(width)]

    def of(self, char: str) -> int:
        """The positions of ``char``."""
        return self.repeated(char, 1, 1, 0)

    def repeated(self, char: str, count: int, times: int, step: int) -> int:
        """The positions i where ``count`` copies of ``char`` start, and again at i + step, ..., i + (times-1) step.

        By doubling: O(log count + log times) big-integer operations.
        """
        key = (char, count, times, step)
        bits = self._cache.get(key)
        if bits is not None:
            return bits
        if times > 1:
            half = times >> 1
            unit = self.repeated(char, count, half, step)
            bits = unit & (unit >> (half * step))
            if times & 1:
                bits &= self.repeated(char, count, 1, 0) >> ((times - 1) * step)
        elif count > 1:
            half = count >> 1
            unit = self.repeated(char, half, 1, 0)
            bits = unit & (unit >> half)
            if count & 1:
                bits &= self.of(char) >> (count - 1)
        else:
            planes = self._planes
            if planes is None:
                planes = self._planes = self._make_planes()
            code = ord(self._alphabet.codes[ord(char)])
            bits = -1
            for bit, plane in enumerate(planes):
                bits &= plane if code >> bit & 1 else ~plane
            # every code has a bit set, so ``bits`` is non-negative now
        self._cache[key] = bits
        return bits


class _Segment:
    """A fixed-length part of a LIKE pattern: literal characters, and ``None`` for _ (any one character)."""

    __slots__ = ("chars", "length", "pieces", "steps", "text")

    def __init__(self, chars: list[str | None]) -> None:
        self.length = len(chars)
        # the whole segment when it is all literal (then it is found with str.find)
        self.text = None if None in chars else "".join(chars)  # type: ignore[arg-type]
        # maximal stretches of literal characters: (offset, text)
        self.pieces: list[tuple[int, str]] = []
        # maximal runs of one repeated character: (offset, character, count)
        runs: list[tuple[int, str, int]] = []
        for offset, char in enumerate(chars):
            if char is None:
                continue
            if offset and chars[offset - 1] is not None:
                start, piece = self.pieces[-1]
                self.pieces[-1] = (start, piece + char)
            else:
                self.pieces.append((offset, char))
            if offset and chars[offset - 1] == char:
                start, _, count = runs[-1]
                runs[-1] = (start, char, count + 1)
            else:
                runs.append((offset, char, 1))
        # the steps of the bit-parallel search: equal runs at equally spaced offsets, (offset, char, count,
        # times, step), one step each
        by_run: dict[tuple[str, int], list[int]] = {}
        for offset, char, count in runs:
            by_run.setdefault((char, count), []).append(offset)
        self.steps: list[tuple[int, str, int, int, int]] = []
        for (char, count), offsets in by_run.items():
            i = 0
            while i < len(offsets):
                j = i + 1
                if j < len(offsets):
                    step = offsets[j] - offsets[i]
                    while j + 1 < len(offsets) and offsets[j + 1] - offsets[j] == step:
                        j += 1
                    j += 1
                else:
                    step = 0
                self.steps.append((offsets[i], char, count, j - i, step))
                i = j
        self.chars = "".join(dict.fromkeys(char for _, char, _ in runs))

    def at(self, value: str, pos: int) -> bool:
        """Whether the segment matches ``value`` at ``pos`` (``pos + length <= len(value)``)."""
        if self.text is not None:
            return value.startswith(self.text, pos)
        return all(value.startswith(piece, pos + offset) for offset, piece in self.pieces)

    def find(self, value: str, pos: int, limit: int, positions: _Positions) -> int:
        """The leftmost start ``i >= pos`` where the segment matches with ``i + length <= limit``, or -1."""
        if self.text is not None:
            return value.find(self.text, pos, limit)
        last = limit - self.length  # the last start that leaves room
        if last < pos:
            return -1
        if not self.steps:
            return pos  # all _
        starts = ((1 << (last - pos + 1)) - 1) << pos  # possible starts: pos to last
        few = (len(value) >> 3) // len(self.pieces) + _SPARSE_SLACK
        for done, (offset, char, count, times, step) in enumerate(self.steps, 1):
            starts &= positions.repeated(char, count, times, step) >> offset
            if not starts:
                return -1
            if (done & (done - 1) == 0 or done % _SPARSE_EVERY == 0) and starts.bit_count() <= few:
                break  # few enough to try one by one
        while starts:  # leftmost (lowest bit) first
            lowest = starts & -starts
            start = lowest.bit_length() - 1
            if self.at(value, start):
                return start
            starts ^= lowest
        return -1


class _LikePattern:
    """A LIKE pattern: ``%`` any run of characters, ``_`` any one character, ``escape`` quotes the next."""

    __slots__ = ("alphabet", "exact", "first", "last", "middle", "min_length")

    def __init__(self, pattern: str, escape: str | None) -> None:
        segments: list[list[str | None]] = [[]]
        chars = iter(pattern)
        for char in chars:
            if char == escape:
                quoted = next(chars, None)
                if quoted is None:
                    raise ValueError("LIKE pattern ends with its escape character")
                segments[-1].append(quoted)
            elif char == "%":
                segments.append([])
            elif char == "_":
                segments[-1].append(None)
            else:
                segments[-1].append(char)
        compiled = [_Segment(s) for s in segments]
        self.exact = len(compiled) == 1
        self.first = compiled[0]
        self.last = compiled[-1]
        self.middle = [s for s in compiled[1:-1] if s.length]
        self.min_length = sum(s.length for s in compiled)
        searched = "".join(s.chars for s in self.middle if s.text is None)
        self.alphabet = _Alphabet(searched) if searched else None

    def matches(self, value: str) -> bool:
        n = len(value)
        first, last = self.first, self.last
        if self.exact:
            return n == first.length and first.at(value, 0)
        if n < self.min_length or not first.at(value, 0) or not last.at(value, n - last.length):
            return False
        pos, limit = first.length, n - last.length
        positions = _Positions(value, self.alphabet) if self.alphabet is not None else None
        for segment in self.middle:
            start = segment.find(value, pos, limit, positions)  # type: ignore[arg-type]
            if start < 0:
                return False
            pos = start + segment.length
        return True


# -- tokens ----------------------------------------------------------------------------------------
_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
_WHITESPACE = frozenset(" \t\f\r\n")  # §3.8.1.1: space, horizontal tab, form feed and line terminator
_ID_START = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})  # Character.isJavaIdentifierStart
_ID_PART = _ID_START | {"Nd", "Mn", "Mc", "Cf"}  # Character.isJavaIdentifierPart
_NUMBER = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_MAX_DEPTH = 50  # nested parentheses, NOT and unary signs


class _Token(NamedTuple):
    kind: str  # "string", "exact", "approximate", "identifier", "keyword", "operator", "end"
    value: Any
    pos: int
    text: str


def _is_id_start(char: str) -> bool:
    return unicodedata.category(char) in _ID_START


def _is_id_part(char: str) -> bool:
    return unicodedata.category(char) in _ID_PART


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, end = 0, len(text)
    while pos < end:
        char = text[pos]
        start = pos
        if char in _WHITESPACE:
            pos += 1
            continue
        if char == "'":
            # §3.8.1.1: a string literal in single quotes, an included quote doubled
            parts = []
            pos += 1
            while True:
                close = text.find("'", pos)
                if close < 0:
                    raise SelectorError("unterminated string literal", text, start)
                parts.append(text[pos:close])
                if text.startswith("'", close + 1):
                    parts.append("'")
                    pos = close + 2
                else:
                    pos = close + 1
                    break
            tokens.append(_Token("string", "".join(parts), start, text[start:pos]))
            continue
        number = _NUMBER.match(text, pos)
        if number is not None:
            pos = number.end()
            literal = number.group()
            if pos < end and (text[pos] == "." or _is_id_part(text[pos])):
                raise SelectorError(f"malformed number {text[start : pos + 1]!r}", text, start)
            if "." in literal or "e" in literal or "E" in literal:
                tokens.append(_Token("approximate", float(literal), start, literal))
            elif len(literal) > 20:  # beyond any long, and int() refuses very long digit strings
                raise SelectorError(f"integer literal {literal[:20]}... is out of range of a long", text, start)
            else:
                tokens.append(_Token("exact", int(literal), start, literal))
            continue
        if _is_id_start(char):
            pos += 1
            while pos < end and _is_id_part(text[pos]):
                pos += 1
            word = text[start:pos]
            upper = word.upper()
            if upper in _KEYWORDS:  # reserved words are case-insensitive, identifiers are not
                tokens.append(_Token("keyword", upper, start, word))
            else:
                tokens.append(_Token("identifier", word, start, word))
            continue
        if text.startswith(("!=", "=="), pos):
            raise SelectorError(f"unknown operator {text[pos : pos + 2]!r} (use = or <>)", text, start)
        for op in _OPERATORS:
            if text.startswith(op, pos):
                tokens.append(_Token("operator", op, start, op))
                pos += len(op)
                break
        else:
            raise SelectorError(f"unexpected character {char!r}", text, start)
    tokens.append(_Token("end", None, end, ""))
    return tokens


# -- parser ----------------------------------------------------------------------------------------
# Static kinds: what an expression can evaluate to, known before any message. "any" is an identifier,
# whose type depends on the message.
_BOOLEAN, _NUMERIC, _STRING, _ANY = "boolean", "numeric", "string", "any"


class _Expr(NamedTuple):
    evaluate: Evaluator
    kind: str
    pos: int


def _constant(value: Any) -> Evaluator:
    return lambda m: value


class _Parser:
    """Recursive descent over the JMS 2.0 §3.8.1.1 grammar, precedence lowest first:

    or: and (OR and)* ; and: not (AND not)* ; not: NOT not | predicate ;
    predicate: sum [ cmp sum | [NOT] BETWEEN sum AND sum | [NOT] IN (str, ...) | [NOT] LIKE str [ESCAPE str]
                   | IS [NOT] NULL ] ;
    sum: product ((+|-) product)* ; product: unary ((*|/) unary)* ; unary: (+|-) unary | primary ;
    primary: literal | identifier | ( or )
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0
        self.reads = 0  # the sections the selector's identifiers name (HEADER | PROPERTIES | APPLICATION_PROPERTIES)

    # token helpers
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def at(self, kind: str, *values: str) -> bool:
        token = self.tokens[self.index]
        return token.kind == kind and token.value in values

    def error(self, reason: str, pos: int) -> SelectorError:
        return SelectorError(reason, self.text, pos)

    def describe(self, token: _Token) -> str:
        if token.kind == "end":
            return "end of selector"
        if token.kind == "keyword":
            return f"reserved word {token.value}"
        return repr(token.text)

    def expect(self, kind: str, value: str, what: str) -> _Token:
        token = self.peek()
        if token.kind != kind or token.value != value:
            raise self.error(f"expected {what}, found {self.describe(token)}", token.pos)
        return self.advance()

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.error(f"selector nested more than {_MAX_DEPTH} deep", token.pos)

    # static checks
    def boolean(self, expr: _Expr, role: str) -> Evaluator:
        """The evaluator of ``expr`` in a boolean context, which gives only True, False or None."""
        if expr.kind == _BOOLEAN:
            return expr.evaluate
        if expr.kind == _ANY:
            evaluate = expr.evaluate
            return lambda m: _truth(evaluate(m))
        raise self.error(f"{role} must be a boolean expression, not a {expr.kind} one", expr.pos)

    def numeric(self, expr: _Expr, role: str) -> None:
        if expr.kind not in (_NUMERIC, _ANY):
            raise self.error(f"{role} must be a numeric expression, not a {expr.kind} one", expr.pos)

    def not_numeric(self, expr: _Expr, role: str) -> None:
        if expr.kind in (_NUMERIC, _BOOLEAN):
            raise self.error(f"{role} must be a string expression, not a {expr.kind} one", expr.pos)

    # grammar
    def parse(self) -> Evaluator:
        if self.peek().kind == "end":
            return _constant(True)  # JMS: an empty selector means no selector
        expr = self.or_expr()
        token = self.peek()
        if token.kind != "end":
            raise self.error(f"unexpected {self.describe(token)} after a complete expression", token.pos)
        return self.boolean(expr, "a selector")

    def or_expr(self) -> _Expr:
        first = self.and_expr()
        if not self.at("keyword", "OR"):
            return first
        operands = [self.boolean(first, "an operand of OR")]
        while self.at("keyword", "OR"):
            self.advance()
            operands.append(self.boolean(self.and_expr(), "an operand of OR"))

        def evaluate(m: MessageFields) -> bool | None:
            unknown = False
            for operand in operands:
                value = operand(m)
                if value is True:
                    return True
                if value is None:
                    unknown = True
            return None if unknown else False

        return _Expr(evaluate, _BOOLEAN, first.pos)

    def and_expr(self) -> _Expr:
        first = self.not_expr()
        if not self.at("keyword", "AND"):
            return first
        operands = [self.boolean(first, "an operand of AND")]
        while self.at("keyword", "AND"):
            self.advance()
            operands.append(self.boolean(self.not_expr(), "an operand of AND"))

        def evaluate(m: MessageFields) -> bool | None:
            unknown = False
            for operand in operands:
                value = operand(m)
                if value is False:
                    return False
                if value is None:
                    unknown = True
            return None if unknown else True

        return _Expr(evaluate, _BOOLEAN, first.pos)

    def not_expr(self) -> _Expr:
        if not self.at("keyword", "NOT"):
            return self.predicate()
        token = self.advance()
        self.enter(token)
        operand = self.boolean(self.not_expr(), "the operand of NOT")
        self.depth -= 1

        def evaluate(m: MessageFields) -> bool | None:
            value = operand(m)
            return None if value is None else not value

        return _Expr(evaluate, _BOOLEAN, token.pos)

    def predicate(self) -> _Expr:
        left = self.sum()
        token = self.peek()
        if token.kind == "operator" and token.value in _COMPARISONS:
            self.advance()
            expr = self.comparison(token, left, self.sum())
        elif token.kind == "keyword" and token.value == "IS":
            expr = self.is_null(left)
        elif token.kind == "keyword" and token.value in ("NOT", "BETWEEN", "IN", "LIKE"):
            negated = token.value == "NOT"
            if negated:
                self.advance()
                if not self.at("keyword", "BETWEEN", "IN", "LIKE"):
                    raise self.error(f"expected BETWEEN, IN or LIKE after NOT, found {self.describe(self.peek())}",
                                     self.peek().pos)  # fmt: skip
            word = self.advance().value
            if word == "BETWEEN":
                expr = self.between(left, negated)
            elif word == "IN":
                expr = self.in_list(left, negated)
            else:
                expr = self.like(left, negated)
        else:
            return left
        after = self.peek()
        if (after.kind == "operator" and after.value in _COMPARISONS) or (
            after.kind == "keyword" and after.value in ("IS", "BETWEEN", "IN", "LIKE")
        ):
            raise self.error("comparisons cannot be chained; use parentheses", after.pos)
        return expr

    def comparison(self, token: _Token, left: _Expr, right: _Expr) -> _Expr:
        op = token.value
        if op not in ("=", "<>"):
            for operand in (left, right):
                if operand.kind in (_STRING, _BOOLEAN):
                    raise self.error(f"{operand.kind}s can only be compared with = and <>", operand.pos)
        compare = _COMPARISONS[op]
        lf, rf = left.evaluate, right.evaluate
        return _Expr(lambda m: compare(lf(m), rf(m)), _BOOLEAN, left.pos)

    def is_null(self, left: _Expr) -> _Expr:
        self.advance()
        negated = self.at("keyword", "NOT")
        if negated:
            self.advance()
        self.expect("keyword", "NULL", "NULL after IS NOT" if negated else "NULL or NOT NULL after IS")
        lf = left.evaluate
        if negated:
            return _Expr(lambda m: lf(m) is not None, _BOOLEAN, left.pos)
        return _Expr(lambda m: lf(m) is None, _BOOLEAN, left.pos)

    def between(self, left: _Expr, negated: bool) -> _Expr:
        low = self.sum()
        self.expect("keyword", "AND", "AND between the bounds of BETWEEN")
        high = self.sum()
        for operand in (left, low, high):
            self.numeric(operand, "an operand of BETWEEN")
        lf, low_f, high_f = left.evaluate, low.evaluate, high.evaluate
        ge, le, lt, gt = _COMPARISONS[">="], _COMPARISONS["<="], _COMPARISONS["<"], _COMPARISONS[">"]
        if negated:
            # §3.8.1.1: "age NOT BETWEEN 15 AND 19" is equivalent to "age < 15 OR age > 19"
            def evaluate(m: MessageFields) -> bool | None:
                value = lf(m)
                return _or(lt(value, low_f(m)), gt(value, high_f(m)))
        else:
            # §3.8.1.1: "age BETWEEN 15 AND 19" is equivalent to "age >= 15 AND age <= 19"
            def evaluate(m: MessageFields) -> bool | None:
                value = lf(m)
                return _and(ge(value, low_f(m)), le(value, high_f(m)))

        return _Expr(evaluate, _BOOLEAN, left.pos)

    def in_list(self, left: _Expr, negated: bool) -> _Expr:
        self.not_numeric(left, "the operand of IN")
        self.expect("operator", "(", "'(' after IN")
        items = {self.string_literal("an IN list item")}
        while self.at("operator", ","):
            self.advance()
            items.add(self.string_literal("an IN list item"))
        self.expect("operator", ")", "',' or ')' in the IN list")
        values = frozenset(items)
        lf = left.evaluate

        # §3.8.1.1: "x IN ('a', 'b')" is equivalent to "(x = 'a') OR (x = 'b')", and NOT IN to its negation
        def evaluate(m: MessageFields) -> bool | None:
            value = lf(m)
            if value is None:
                return None
            return (isinstance(value, str) and value in values) is not negated

        return _Expr(evaluate, _BOOLEAN, left.pos)

    def like(self, left: _Expr, negated: bool) -> _Expr:
        self.not_numeric(left, "the operand of LIKE")
        pattern_token = self.peek()
        pattern = self.string_literal("the LIKE pattern")
        escape = None
        if self.at("keyword", "ESCAPE"):
            self.advance()
            escape_token = self.peek()
            escape = self.string_literal("the ESCAPE character")
            if len(escape) != 1:
                raise self.error(f"the ESCAPE character must be one character, not {escape!r}", escape_token.pos)
        try:
            compiled = _LikePattern(pattern, escape)
        except ValueError as exc:
            raise self.error(str(exc), pattern_token.pos) from None
        lf = left.evaluate

        def evaluate(m: MessageFields) -> bool | None:
            value = lf(m)
            if not isinstance(value, str):
                return None  # NULL, or not a string: UNKNOWN, whether LIKE or NOT LIKE
            return compiled.matches(value) is not negated

        return _Expr(evaluate, _BOOLEAN, left.pos)

    def string_literal(self, what: str) -> str:
        token = self.peek()
        if token.kind != "string":
            raise self.error(f"{what} must be a string literal, found {self.describe(token)}", token.pos)
        self.advance()
        return str(token.value)

    def sum(self) -> _Expr:
        return self.chain(self.product, ("+", "-"))

    def product(self) -> _Expr:
        return self.chain(self.unary, ("*", "/"))

    def chain(self, operand: Callable[[], _Expr], ops: tuple[str, ...]) -> _Expr:
        """Left-associative arithmetic, evaluated in a loop rather than as a left-deep tree."""
        first = operand()
        if not self.at("operator", *ops):
            return first
        rest: list[tuple[Callable[[Any, Any], Any], Evaluator]] = []
        self.numeric(first, f"an operand of {self.peek().value}")
        while self.at("operator", *ops):
            op = self.advance().value
            right = operand()
            self.numeric(right, f"an operand of {op}")
            rest.append((_ARITHMETIC[op], right.evaluate))
        head = first.evaluate

        def evaluate(m: MessageFields) -> Any:
            value = head(m)
            for apply, right_f in rest:
                value = apply(value, right_f(m))
            return value

        return _Expr(evaluate, _NUMERIC, first.pos)

    def unary(self) -> _Expr:
        if not self.at("operator", "+", "-"):
            return self.primary()
        token = self.advance()
        following = self.peek()
        if token.value == "-" and following.kind in ("exact", "approximate"):
            # fold a negative literal, so the smallest long is writable as -9223372036854775808
            self.advance()
            value = -following.value
            if following.kind == "exact" and value < _LONG_MIN:
                raise self.error(f"integer literal -{following.text} is out of range of a long", token.pos)
            return _Expr(_constant(value), _NUMERIC, token.pos)
        self.enter(token)
        operand = self.unary()
        self.depth -= 1
        self.numeric(operand, f"the operand of unary {token.value}")
        of = operand.evaluate
        if token.value == "-":
            return _Expr(lambda m: _negate(of(m)), _NUMERIC, token.pos)
        return _Expr(lambda m: _plus(of(m)), _NUMERIC, token.pos)

    def primary(self) -> _Expr:
        token = self.peek()
        kind = token.kind
        if kind == "string":
            self.advance()
            return _Expr(_constant(token.value), _STRING, token.pos)
        if kind == "exact":
            self.advance()
            if token.value > _LONG_MAX:
                raise self.error(f"integer literal {token.text} is out of range of a long", token.pos)
            return _Expr(_constant(token.value), _NUMERIC, token.pos)
        if kind == "approximate":
            self.advance()
            return _Expr(_constant(token.value), _NUMERIC, token.pos)
        if kind == "identifier":
            self.advance()
            name = token.value
            if name in _HEADER_FIELDS:
                self.reads |= _HEADER_FIELD_SECTIONS.get(name, PROPERTIES)
            else:
                self.reads |= APPLICATION_PROPERTIES
            return _Expr(_identifier(name), _ANY, token.pos)
        if kind == "keyword":
            if token.value in ("TRUE", "FALSE"):
                self.advance()
                return _Expr(_constant(token.value == "TRUE"), _BOOLEAN, token.pos)
            if token.value == "NULL":
                raise self.error("NULL can only be tested with IS [NOT] NULL", token.pos)
            raise self.error(
                f"expected an expression, found reserved word {token.value} (reserved words are not identifiers)",
                token.pos,
            )
        if kind == "operator" and token.value == "(":
            self.advance()
            self.enter(token)
            inner = self.or_expr()
            self.expect("operator", ")", f"')' to close the '(' at column {token.pos + 1}")
            self.depth -= 1
            return _Expr(inner.evaluate, inner.kind, token.pos)
        raise self.error(f"expected an expression, found {self.describe(token)}", token.pos)


def _identifier(name: str) -> Evaluator:
    header = _HEADER_FIELDS.get(name)
    if header is not None:
        return header
    return lambda m: m.application_properties.get(name)


# -- public API ------------------------------------------------------------------------------------
class Selector:
    """A compiled JMS message selector.

    ``max_length``: the longest selector text accepted, in characters (None: any); a longer one raises
    ``SelectorError`` before anything is parsed. ``max_properties_size``: the largest section (header,
    properties, application-properties) the selector reads, in bytes (None: any); a message with a larger
    section is not selected by a selector that reads a field of it (see ``MessageFields.from_message``).
    """

    __slots__ = ("_evaluate", "_reads", "max_properties_size", "source")

    def __init__(
        self,
        text: str,
        *,
        max_length: int | None = None,
        max_properties_size: int | None = DEFAULT_MAX_PROPERTIES_SIZE,
    ) -> None:
        if not isinstance(text, str):
            raise SelectorError(f"a selector must be a string, not {type(text).__name__}")
        if max_length is not None and len(text) > max_length:
            raise SelectorError(f"selector of {len(text)} characters is longer than the limit of {max_length}")
        self.source = text
        self.max_properties_size = max_properties_size
        try:
            parser = _Parser(text)
            self._evaluate = parser.parse()
        except RecursionError:  # a safety net: _MAX_DEPTH keeps the parser well inside the limit
            raise SelectorError("selector nested too deeply", text, 0) from None
        self._reads = parser.reads

    def matches(self, message: MessageFields) -> bool:
        """Whether the selector is TRUE for ``message`` (FALSE and UNKNOWN do not select, §3.8.1.1).

        A message whose section holding a field the selector reads was too large to decode is not selected,
        whatever the selector (``NOT`` included): its fields are not known.
        """
        if message.oversized & self._reads:
            return False
        return self._evaluate(message) is True

    def __repr__(self) -> str:
        return f"Selector({self.source!r})"


def selector_from_filter(
    filter_set: Mapping[Any, Any] | None,
    *,
    max_length: int | None = None,
    max_properties_size: int | None = DEFAULT_MAX_PROPERTIES_SIZE,
) -> tuple[Any, Selector] | None:
    """The JMS selector entry of a source's filter-set (Part 3 §3.5.8) as ``(key, Selector)``, if any.

    Raises ``SelectorError`` when the entry is there but is not a valid selector (or is longer than
    ``max_length``). ``max_properties_size`` is the selector's (see ``Selector``).
    """
    if not filter_set:
        return None
    for key, value in filter_set.items():
        if not isinstance(value, Described) or not _is_selector_descriptor(value.descriptor):
            continue
        if not isinstance(value.value, str):
            raise SelectorError(f"selector filter {key!r} must hold a string, not {type(value.value).__name__}")
        return key, Selector(value.value, max_length=max_length, max_properties_size=max_properties_size)
    return None


def _is_selector_descriptor(descriptor: Any) -> bool:
    return isinstance(descriptor, int | str) and descriptor in SELECTOR_DESCRIPTORS
