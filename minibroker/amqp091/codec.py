"""AMQP 0-9-1 method arguments, field tables and content properties (0-9-1 §4.2.5, §4.2.6), both ways.

Theory of operation: the generated classes in ``definitions`` list their fields as ``(name, wire_type)``; this
module is the one place that turns a wire type into bytes and back. Decoding reads from a ``_Reader`` bounded
by the frame's payload and raises only ``ProtocolError``: 501 frame-error for bytes that do not fit the
method's or table's layout (RabbitMQ's ``rabbit_misc:frame_error``, "cannot decode"), 502 syntax-error for
values the grammar has no meaning for (an unknown field-value type, a property flag past the last property,
a content-header weight that is not zero, tables nested deeper than ``MAX_DEPTH``), 503 command-invalid for a
class-id/method-id pair the specification does not define. Encoding raises only ``EncodeError``.

Field tables take RabbitMQ's field types (its errata to §4.2.1 and ``rabbit_binary_parser``): t b B s u I i l
D S A T F V x, plus d and f (doubles and floats, which RabbitMQ and pika also read), and L read as l.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from minibroker.amqp091 import values as v
from minibroker.amqp091.base import Method, Properties
from minibroker.amqp091.definitions import METHODS, PROPERTIES, ReplyCode
from minibroker.amqp091.errors import EncodeError, ProtocolError

MAX_DEPTH = 64
"""How deep tables and arrays may nest before a peer's table is refused (502): a guard against recursion."""

_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_HH = struct.Struct(">HH")
_HHQ = struct.Struct(">HHQ")
_LONG = struct.Struct(">q")
LONG_LOW, LONG_HIGH = -(2**63), 2**63 - 1
_TAG_STRUCTS: dict[bytes, tuple[struct.Struct, type[Any]]] = {
    b"b": (struct.Struct(">b"), v.Byte),
    b"B": (_B, v.UByte),
    b"s": (struct.Struct(">h"), v.Short),
    b"u": (_H, v.UShort),
    b"I": (struct.Struct(">i"), v.Int),
    b"i": (_I, v.UInt),
    b"l": (_LONG, int),
    b"L": (_LONG, int),
    b"T": (_Q, v.Timestamp),
    b"f": (struct.Struct(">f"), v.Float),
    b"d": (struct.Struct(">d"), float),
}
_DECIMAL = struct.Struct(">BI")


# -- reading -------------------------------------------------------------------------------------------------
class _Reader:
    """A cursor over one frame's payload; running past its end is a 501 frame-error."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def take(self, n: int) -> bytes:
        start = self.pos
        if start + n > self.end:
            raise ProtocolError(
                ReplyCode.FRAME_ERROR, f"{n} bytes needed at offset {start}, the frame ends at {self.end}"
            )
        self.pos = start + n
        return bytes(self.data[start : start + n])

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        start = self.pos
        if start + fmt.size > self.end:
            raise ProtocolError(
                ReplyCode.FRAME_ERROR, f"{fmt.size} bytes needed at offset {start}, the frame ends at {self.end}"
            )
        self.pos = start + fmt.size
        return fmt.unpack_from(self.data, start)

    def number(self, fmt: struct.Struct) -> Any:
        return self.unpack(fmt)[0]

    def shortstr(self) -> str:
        return self.take(self.number(_B)).decode("utf-8", "surrogateescape")

    def longstr(self) -> bytes:
        return self.take(self.number(_I))

    def table(self, depth: int = 0) -> dict[str, Any]:
        size = self.number(_I)
        inner = _Reader(self.data, self.pos, self.pos + size)
        if inner.end > self.end:
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"a table of {size} bytes runs past the frame's end")
        self.pos = inner.end
        result: dict[str, Any] = {}
        while inner.pos < inner.end:
            key = inner.shortstr()
            result[key] = inner.field_value(depth)
        return result

    def array(self, depth: int) -> list[Any]:
        size = self.number(_I)
        inner = _Reader(self.data, self.pos, self.pos + size)
        if inner.end > self.end:
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"an array of {size} bytes runs past the frame's end")
        self.pos = inner.end
        result: list[Any] = []
        while inner.pos < inner.end:
            result.append(inner.field_value(depth))
        return result

    def field_value(self, depth: int) -> Any:
        tag = self.take(1)
        fixed = _TAG_STRUCTS.get(tag)
        if fixed is not None:
            fmt, kind = fixed
            return kind(self.number(fmt))
        if tag == b"S":
            return self.longstr().decode("utf-8", "surrogateescape")
        if tag == b"t":
            return self.number(_B) != 0
        if tag in (b"F", b"A"):
            if depth >= MAX_DEPTH:
                raise ProtocolError(ReplyCode.SYNTAX_ERROR, f"tables and arrays nested deeper than {MAX_DEPTH}")
            return self.table(depth + 1) if tag == b"F" else self.array(depth + 1)
        if tag == b"x":
            return self.longstr()
        if tag == b"V":
            return None
        if tag == b"D":
            scale, unscaled = self.unpack(_DECIMAL)
            return Decimal(unscaled).scaleb(-scale)
        raise ProtocolError(ReplyCode.SYNTAX_ERROR, f"unknown field-value type {tag!r}")


_READ: dict[str, Callable[[_Reader], Any]] = {
    "octet": lambda r: r.number(_B),
    "short": lambda r: r.number(_H),
    "long": lambda r: r.number(_I),
    "longlong": lambda r: r.number(_Q),
    "timestamp": lambda r: r.number(_Q),
    "shortstr": _Reader.shortstr,
    "longstr": _Reader.longstr,
    "table": _Reader.table,
}


def decode_method(payload: bytes | bytearray | memoryview) -> Method:
    """A method frame's payload (§4.2.4: class-id, method-id, arguments) as its generated class."""
    reader = _Reader(payload)
    class_id, method_id = reader.unpack(_HH)
    cls = METHODS.get((class_id, method_id))
    if cls is None:
        raise ProtocolError(
            ReplyCode.COMMAND_INVALID, f"no method {class_id}.{method_id}", class_id=class_id, method_id=method_id
        )
    try:
        arguments: list[Any] = []
        bits = bit = 0
        for _, wire in cls.FIELDS:
            if wire == "bit":
                # §4.2.5.2: consecutive bits share octets, the first bit in the low-order bit
                if bit in (0, 8):
                    bits, bit = reader.number(_B), 0
                arguments.append(bool(bits >> bit & 1))
                bit += 1
                continue
            bit = 0
            arguments.append(_READ[wire](reader))
        if reader.pos != reader.end:
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"{reader.end - reader.pos} bytes after the arguments")
    except ProtocolError as exc:
        raise ProtocolError(exc.reply_code, f"{cls.NAME}: {exc.text}", class_id=class_id, method_id=method_id) from None
    return cls(*arguments)


def decode_content_header(payload: bytes | bytearray | memoryview) -> tuple[int, int, Properties]:
    """A content header frame's payload (§4.2.6.1) as (class-id, body size, properties)."""
    reader = _Reader(payload)
    class_id, weight, body_size = reader.unpack(_HHQ)
    cls = PROPERTIES.get(class_id)
    if cls is None:
        raise ProtocolError(ReplyCode.UNEXPECTED_FRAME, f"a content header for class {class_id}, which has no content")
    if weight != 0:
        raise ProtocolError(
            ReplyCode.SYNTAX_ERROR, f"content header weight {weight}: it must be zero", class_id=class_id
        )
    flags: list[bool] = []
    while True:
        word = reader.number(_H)
        flags += [bool(word >> (15 - i) & 1) for i in range(15)]
        if not word & 1:  # §4.2.6.1: the low bit says another flag word follows
            break
    if any(flags[len(cls.PROPERTIES) :]):
        raise ProtocolError(
            ReplyCode.SYNTAX_ERROR, f"a property flag past class {class_id}'s last property", class_id=class_id
        )
    try:
        found = {name: _READ[wire](reader) for (name, wire), flag in zip(cls.PROPERTIES, flags, strict=False) if flag}
    except ProtocolError as exc:
        raise ProtocolError(exc.reply_code, f"content header: {exc.text}", class_id=class_id) from None
    if reader.pos != reader.end:
        raise ProtocolError(
            ReplyCode.FRAME_ERROR, f"{reader.end - reader.pos} bytes after the properties", class_id=class_id
        )
    return class_id, body_size, cls(**found)


# -- writing -------------------------------------------------------------------------------------------------
def _int_writer(fmt: struct.Struct, low: int, high: int, wire: str) -> Callable[[bytearray, Any], None]:
    def write(out: bytearray, value: Any) -> None:
        if type(value) is bool or not isinstance(value, int) or not low <= value <= high:
            raise EncodeError(f"{value!r} is not a {wire} ({low}..{high})")
        out += fmt.pack(value)

    return write


def _write_shortstr(out: bytearray, value: Any) -> None:
    if not isinstance(value, str):
        raise EncodeError(f"{value!r} is not a shortstr (a str)")
    data = _utf8(value)
    if len(data) > 255:
        # §4.2.5.3: a short string holds at most 255 octets
        raise EncodeError(f"a shortstr holds at most 255 bytes, not {len(data)}: {value[:40]!r}...")
    out += _B.pack(len(data))
    out += data


def _write_longstr(out: bytearray, value: Any) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise EncodeError(f"{value!r} is not a longstr (bytes)")
    _write_sized(out, bytes(value))


def _write_sized(out: bytearray, data: bytes) -> None:
    if len(data) > 0xFFFFFFFF:
        raise EncodeError(f"{len(data)} bytes do not fit a 32-bit size")
    out += _I.pack(len(data))
    out += data


def _utf8(value: str) -> bytes:
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise EncodeError(f"{value!r} cannot be written as UTF-8: {exc}") from None


def _write_table(out: bytearray, value: Any) -> None:
    if not isinstance(value, dict):
        raise EncodeError(f"{value!r} is not a table (a dict)")
    start = len(out)
    out += b"\0\0\0\0"
    for key, item in value.items():
        _write_shortstr(out, key)
        _write_field_value(out, item)
    _I.pack_into(out, start, len(out) - start - 4)


def _write_array(out: bytearray, value: list[Any] | tuple[Any, ...]) -> None:
    start = len(out)
    out += b"\0\0\0\0"
    for item in value:
        _write_field_value(out, item)
    _I.pack_into(out, start, len(out) - start - 4)


def _write_field_value(out: bytearray, value: Any) -> None:
    """One table or array value, its field type chosen by its Python type (see ``values``)."""
    kind = type(value)
    if kind is bool:
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, v._Ranged):
        tag = value.TAG
        out += tag
        out += _TAG_STRUCTS[tag][0].pack(value)
    elif isinstance(value, int):
        if not LONG_LOW <= value <= LONG_HIGH:
            raise EncodeError(f"{value} does not fit a signed 64-bit table value (l)")
        out += b"l"
        out += _LONG.pack(value)
    elif isinstance(value, v.Float):
        out += b"f"
        out += _TAG_STRUCTS[b"f"][0].pack(value)
    elif isinstance(value, float):
        out += b"d"
        out += _TAG_STRUCTS[b"d"][0].pack(value)
    elif isinstance(value, str):
        out += b"S"
        _write_sized(out, _utf8(value))
    elif isinstance(value, bytes | bytearray | memoryview):
        out += b"x"
        _write_sized(out, bytes(value))
    elif isinstance(value, dict):
        out += b"F"
        _write_table(out, value)
    elif isinstance(value, list | tuple):
        out += b"A"
        _write_array(out, value)
    elif value is None:
        out += b"V"
    elif isinstance(value, Decimal):
        out += b"D"
        out += _decimal(value)
    else:
        raise EncodeError(f"{value!r} ({kind.__name__}) has no field type")


def _decimal(value: Decimal) -> bytes:
    """``D``: a scale octet and an unsigned 32-bit unscaled value (RabbitMQ's reading)."""
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise EncodeError(f"{value} is not a finite decimal")
    try:
        unscaled = int("".join(map(str, digits)))
    except ValueError:  # more digits than int() converts: too large anyway
        raise EncodeError(f"{value} does not fit a decimal") from None
    if exponent > 0:
        if unscaled and exponent > 10:  # 10**11 is past 32 bits whatever the digits
            raise EncodeError(f"{value} does not fit a decimal")
        unscaled, exponent = unscaled * 10 ** min(exponent, 10), 0
    if (sign and unscaled) or not 0 <= unscaled <= 0xFFFFFFFF or -exponent > 255:
        raise EncodeError(f"{value} does not fit a decimal (scale 0..255, unsigned 32-bit value)")
    return _DECIMAL.pack(-exponent, unscaled)


_WRITE: dict[str, Callable[[bytearray, Any], None]] = {
    "octet": _int_writer(_B, 0, 0xFF, "octet"),
    "short": _int_writer(_H, 0, 0xFFFF, "short"),
    "long": _int_writer(_I, 0, 0xFFFFFFFF, "long"),
    "longlong": _int_writer(_Q, 0, 2**64 - 1, "longlong"),
    "timestamp": _int_writer(_Q, 0, 2**64 - 1, "timestamp"),
    "shortstr": _write_shortstr,
    "longstr": _write_longstr,
    "table": _write_table,
}


def encode_table(table: dict[str, Any]) -> bytes:
    """A field table with its 32-bit size in front (§4.2.5.5)."""
    out = bytearray()
    _write_table(out, table)
    return bytes(out)


def decode_table(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """``encode_table``'s reverse: the whole of ``data`` is one sized table."""
    reader = _Reader(data)
    table = reader.table()
    if reader.pos != reader.end:
        raise ProtocolError(ReplyCode.FRAME_ERROR, f"{reader.end - reader.pos} bytes after the table")
    return table


def encode_method_into(out: bytearray, method: Method) -> None:
    """A method frame's payload: class-id, method-id, then the arguments (§4.2.4, bits packed per §4.2.5.2)."""
    out += _HH.pack(method.CLASS_ID, method.METHOD_ID)
    bits = bit = 0
    for name, wire in method.FIELDS:
        value = getattr(method, name)
        if wire == "bit":
            if type(value) is not bool:
                raise EncodeError(f"{method.NAME}.{name}: {value!r} is not a bit (a bool)")
            if bit == 8:
                out.append(bits)
                bits = bit = 0
            bits |= value << bit
            bit += 1
            continue
        if bit:
            out.append(bits)
            bits = bit = 0
        try:
            _WRITE[wire](out, value)
        except EncodeError as exc:
            raise EncodeError(f"{method.NAME}.{name}: {exc}") from None
    if bit:
        out.append(bits)


def encode_content_header_into(out: bytearray, properties: Properties, body_size: int) -> None:
    """A content header frame's payload (§4.2.6.1): class-id, weight 0, body size, flags, the set properties."""
    if not 0 <= body_size < 2**64:
        raise EncodeError(f"body size {body_size} does not fit 64 bits")
    out += _HHQ.pack(properties.CLASS_ID, 0, body_size)
    specs = properties.PROPERTIES
    present = [getattr(properties, name) is not None for name, _ in specs]
    # §4.2.6.1: one flag word, the first property in the high bit; the generator guarantees at most 15
    # properties and none of type bit, so a continuation word is never needed on the way out
    out += _H.pack(sum(1 << (15 - i) for i, flag in enumerate(present) if flag))
    for (name, wire), flag in zip(specs, present, strict=True):
        if flag:
            try:
                _WRITE[wire](out, getattr(properties, name))
            except EncodeError as exc:
                raise EncodeError(f"property {name}: {exc}") from None
