"""Encoder and decoder for the AMQP 1.0 type system (Part 1 §1.2-§1.6).

Theory of operation: decoding is table driven. Each format code has a *body decoder* that reads the
bytes after the constructor; a full decode reads one constructor byte (or a described constructor,
0x00) and dispatches. Arrays reuse the body decoders, since all their elements share one constructor.

Safety invariant (fuzzed): for any input, ``decode`` either returns a value or raises ``DecodeError``.
Compound and array counts are checked against their declared byte size before any element is read,
so a hostile count cannot make us loop or allocate beyond the bytes actually received. (So an array of
nulls, whose elements take no bytes, holds at most as many as its size; the encoder keeps to that.)

Encoding picks the most compact encoding of the value's type (uint0/smalluint/uint, list0/list8/list32
and so on); described values whose descriptor has a composite class are encoded from that class's
field table (see ``composite.py``).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

from minibroker.amqp.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    EncodeError,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
)

# -- struct helpers -------------------------------------------------------------------------------
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_b = struct.Struct(">b")
_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_BB = struct.Struct(">BB")
_BI = struct.Struct(">BI")
_BBB = struct.Struct(">BBB")
_BII = struct.Struct(">BII")

Body = Callable[[bytes, int], tuple[Any, int]]

# A hook set by ``composite.py``: maps a descriptor (ulong code or symbol name) to a callable that
# builds the typed object from the described value. Kept here so the codec has no import cycle.
DESCRIBED_TYPES: dict[Any, Callable[[Any], Any]] = {}


# -- decoding -------------------------------------------------------------------------------------
def _fixed(st: struct.Struct, wrap: Callable[[Any], Any]) -> Body:
    size = st.size
    unpack = st.unpack_from

    def body(data: bytes, pos: int) -> tuple[Any, int]:
        return wrap(unpack(data, pos)[0]), pos + size

    return body


def _constant(value: Any) -> Body:
    def body(data: bytes, pos: int) -> tuple[Any, int]:
        return value, pos

    return body


def _variable(st: struct.Struct, wrap: Callable[[bytes], Any]) -> Body:
    size = st.size
    unpack = st.unpack_from

    def body(data: bytes, pos: int) -> tuple[Any, int]:
        (n,) = unpack(data, pos)
        start = pos + size
        end = start + n
        if end > len(data):
            raise DecodeError(f"variable-width value of {n} bytes runs past the end of the data")
        return wrap(data[start:end]), end

    return body


def _utf8(raw: bytes) -> str:
    return str(raw, "utf-8")  # not raw.decode: ``data`` may be a memoryview


def _ascii(raw: bytes) -> Symbol:
    return Symbol(str(raw, "ascii"))


def _boolean(data: bytes, pos: int) -> tuple[bool, int]:
    octet = data[pos]
    if octet > 1:
        raise DecodeError(f"boolean octet must be 0 or 1, got {octet}")
    return octet == 1, pos + 1


def _char(data: bytes, pos: int) -> tuple[Char, int]:
    return Char(chr(_I.unpack_from(data, pos)[0])), pos + 4


def _uuid(data: bytes, pos: int) -> tuple[uuid.UUID, int]:
    end = pos + 16
    if end > len(data):
        raise DecodeError("uuid runs past the end of the data")
    return uuid.UUID(bytes=bytes(data[pos:end])), end


def _raw(cls: type[bytes], width: int) -> Body:
    def body(data: bytes, pos: int) -> tuple[Any, int]:
        end = pos + width
        if end > len(data):
            raise DecodeError(f"{cls.__name__.lower()} runs past the end of the data")
        return cls(data[pos:end]), end

    return body


def _compound_header(st: struct.Struct, data: bytes, pos: int) -> tuple[int, int, int]:
    """Read (size, count) of a list/map and return (count, first element pos, end pos)."""
    size, count = st.unpack_from(data, pos)
    width = st.size // 2
    end = pos + width + size
    if end > len(data):
        raise DecodeError(f"compound of {size} bytes runs past the end of the data")
    if size < width or count > size:
        raise DecodeError(f"compound count {count} does not fit its size {size}")
    return count, pos + 2 * width, end


def _items(data: bytes, pos: int, count: int, end: int) -> tuple[list[Any], int]:
    items = []
    for _ in range(count):
        value, pos = _decode(data, pos)
        items.append(value)
    if pos != end:
        raise DecodeError(f"compound elements end at {pos}, its size says {end}")
    return items, pos


def _list(st: struct.Struct) -> Body:
    def body(data: bytes, pos: int) -> tuple[list[Any], int]:
        count, pos, end = _compound_header(st, data, pos)
        return _items(data, pos, count, end)

    return body


def _map(st: struct.Struct) -> Body:
    def body(data: bytes, pos: int) -> tuple[dict[Any, Any], int]:
        count, pos, end = _compound_header(st, data, pos)
        if count % 2:
            raise DecodeError(f"map has an odd number of elements ({count})")
        items, pos = _items(data, pos, count, end)
        try:
            return dict(zip(items[::2], items[1::2], strict=True)), pos
        except TypeError as exc:
            raise DecodeError(f"map key is not usable as a key: {exc}") from exc

    return body


def _array(st: struct.Struct) -> Body:
    def body(data: bytes, pos: int) -> tuple[Array, int]:
        count, pos, end = _compound_header(st, data, pos)
        descriptor = None
        code = data[pos]
        pos += 1
        if code == 0x00:
            descriptor, pos = _decode(data, pos)
            code = data[pos]
            pos += 1
        element = _BODIES.get(code)
        if element is None or code == 0x00:
            raise DecodeError(f"array of unknown format code 0x{code:02x}")
        items = []
        for _ in range(count):
            value, pos = element(data, pos)
            items.append(value)
        if pos != end:
            raise DecodeError(f"array elements end at {pos}, its size says {end}")
        array = Array(_TYPE_NAMES[code], items, descriptor)
        if descriptor is not None:
            make = DESCRIBED_TYPES.get(descriptor)
            if make is not None:
                array.items = [make(item) for item in items]
        return array, pos

    return body


def _described(data: bytes, pos: int) -> tuple[Any, int]:
    descriptor, pos = _decode(data, pos)
    value, pos = _decode(data, pos)
    make = DESCRIBED_TYPES.get(descriptor)
    if make is None:
        try:
            hash(descriptor)
        except TypeError as exc:
            raise DecodeError("descriptor is not a symbol or ulong") from exc
        return Described(descriptor, value), pos
    return make(value), pos


_BODIES: dict[int, Body] = {
    0x00: _described,
    0x40: _constant(None),
    0x41: _constant(True),
    0x42: _constant(False),
    0x56: _boolean,
    0x50: _fixed(_B, UByte),
    0x60: _fixed(_H, UShort),
    0x70: _fixed(_I, UInt),
    0x52: _fixed(_B, UInt),
    0x43: _constant(UInt(0)),
    0x80: _fixed(_Q, ULong),
    0x53: _fixed(_B, ULong),
    0x44: _constant(ULong(0)),
    0x51: _fixed(_b, Byte),
    0x61: _fixed(_h, Short),
    0x71: _fixed(_i, Int),
    0x54: _fixed(_b, Int),
    0x81: _fixed(_q, Long),
    0x55: _fixed(_b, Long),
    0x72: _fixed(_f, Float),
    0x82: _fixed(_d, float),
    0x74: _raw(Decimal32, 4),
    0x84: _raw(Decimal64, 8),
    0x94: _raw(Decimal128, 16),
    0x73: _char,
    0x83: _fixed(_q, Timestamp),
    0x98: _uuid,
    0xA0: _variable(_B, bytes),
    0xB0: _variable(_I, bytes),
    0xA1: _variable(_B, _utf8),
    0xB1: _variable(_I, _utf8),
    0xA3: _variable(_B, _ascii),
    0xB3: _variable(_I, _ascii),
    0x45: _constant(None),  # replaced below: list0 must give a fresh list each time
    0xC0: _list(_BB),
    0xD0: _list(struct.Struct(">II")),
    0xC1: _map(_BB),
    0xD1: _map(struct.Struct(">II")),
    0xE0: _array(_BB),
    0xF0: _array(struct.Struct(">II")),
}
_BODIES[0x45] = lambda data, pos: ([], pos)

_TYPE_NAMES: dict[int, str] = {
    0x40: "null", 0x41: "boolean", 0x42: "boolean", 0x56: "boolean", 0x50: "ubyte", 0x60: "ushort",
    0x70: "uint", 0x52: "uint", 0x43: "uint", 0x80: "ulong", 0x53: "ulong", 0x44: "ulong",
    0x51: "byte", 0x61: "short", 0x71: "int", 0x54: "int", 0x81: "long", 0x55: "long",
    0x72: "float", 0x82: "double", 0x74: "decimal32", 0x84: "decimal64", 0x94: "decimal128",
    0x73: "char", 0x83: "timestamp", 0x98: "uuid", 0xA0: "binary", 0xB0: "binary",
    0xA1: "string", 0xB1: "string", 0xA3: "symbol", 0xB3: "symbol", 0x45: "list", 0xC0: "list",
    0xD0: "list", 0xC1: "map", 0xD1: "map", 0xE0: "array", 0xF0: "array",
}  # fmt: skip


def _decode(data: bytes, pos: int) -> tuple[Any, int]:
    code = data[pos]
    body = _BODIES.get(code)
    if body is None:
        raise DecodeError(f"unknown format code 0x{code:02x} at offset {pos}")
    return body(data, pos + 1)


def decode(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one value starting at ``pos``; return it and the offset just past it.

    Raises ``DecodeError`` and nothing else, whatever the bytes.
    """
    try:
        return _decode(data, pos)
    except DecodeError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise DecodeError(f"malformed AMQP encoding: {exc}") from None
    except RecursionError:
        raise DecodeError("AMQP value nested too deeply") from None


_FIXED_WIDTHS = {
    **dict.fromkeys((0x40, 0x41, 0x42, 0x43, 0x44, 0x45), 0),
    **dict.fromkeys((0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56), 1),
    **dict.fromkeys((0x60, 0x61), 2),
    **dict.fromkeys((0x70, 0x71, 0x72, 0x73, 0x74), 4),
    **dict.fromkeys((0x80, 0x81, 0x82, 0x83, 0x84), 8),
    **dict.fromkeys((0x94, 0x98), 16),
}
_SIZE8 = frozenset({0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0})  # constructor, one size octet, then that many
_SIZE32 = frozenset({0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0})  # constructor, four size octets, then that many


def value_end(payload: bytes, pos: int) -> int:
    """Where the (non-described) value encoded at ``pos`` ends, read from its constructor and size alone (a
    section of a message is skipped, or measured, without decoding it)."""
    code = payload[pos]
    width = _FIXED_WIDTHS.get(code)
    if width is not None:
        end = pos + 1 + width
    elif code in _SIZE8:
        end = pos + 2 + payload[pos + 1]
    elif code in _SIZE32 and pos + 5 <= len(payload):
        end = pos + 5 + int.from_bytes(payload[pos + 1 : pos + 5], "big")
    else:
        raise DecodeError(f"unexpected format code 0x{code:02x} for a message section at offset {pos}")
    if end > len(payload):
        raise DecodeError(f"message section at offset {pos} runs past the end of the message")
    return end


def decode_all(data: bytes) -> list[Any]:
    """Decode a sequence of values that fills ``data`` exactly."""
    values = []
    pos = 0
    while pos < len(data):
        value, pos = decode(data, pos)
        values.append(value)
    return values


# -- encoding -------------------------------------------------------------------------------------
Encoder = Callable[[bytearray, Any], None]


def _enc_null(buf: bytearray, value: Any) -> None:
    buf.append(0x40)


def _enc_bool(buf: bytearray, value: bool) -> None:
    buf.append(0x41 if value else 0x42)


def _enc_small_unsigned(code: int, small: int, zero: int, st: struct.Struct, high: int) -> Encoder:
    pack = st.pack

    def enc(buf: bytearray, value: int) -> None:
        if value == 0:
            buf.append(zero)
        elif 0 < value < 256:
            buf += _BB.pack(small, value)
        elif 0 < value <= high:
            buf.append(code)
            buf += pack(value)
        else:
            raise EncodeError(f"{value} is out of range")

    return enc


def _enc_small_signed(code: int, small: int, st: struct.Struct) -> Encoder:
    pack = st.pack

    def enc(buf: bytearray, value: int) -> None:
        if -128 <= value <= 127:
            buf += _Bb.pack(small, value)
        else:
            buf.append(code)
            buf += pack(value)

    return enc


_Bb = struct.Struct(">Bb")


def _enc_fixed(code: int, st: struct.Struct) -> Encoder:
    pack = st.pack

    def enc(buf: bytearray, value: Any) -> None:
        buf.append(code)
        buf += pack(value)

    return enc


def _enc_int(buf: bytearray, value: int) -> None:
    """A plain Python int encodes as long (as proton does); one above long's range as ulong."""
    if -128 <= value <= 127:
        buf += _Bb.pack(0x55, value)
    elif -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        buf.append(0x81)
        buf += _q.pack(value)
    else:
        _enc_ulong(buf, value)


def _enc_variable(small: int, large: int) -> Encoder:
    def enc(buf: bytearray, raw: bytes) -> None:
        n = len(raw)
        if n < 256:
            buf += _BB.pack(small, n)
        else:
            buf += _BI.pack(large, n)
        buf += raw

    return enc


_enc_vbin = _enc_variable(0xA0, 0xB0)
_enc_str_raw = _enc_variable(0xA1, 0xB1)
_enc_sym_raw = _enc_variable(0xA3, 0xB3)


def _enc_binary(buf: bytearray, value: bytes) -> None:
    _enc_vbin(buf, value)


def _enc_string(buf: bytearray, value: str) -> None:
    _enc_str_raw(buf, value.encode("utf-8"))


def _enc_symbol(buf: bytearray, value: str) -> None:
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raise EncodeError(f"symbol {value!r} is not ASCII") from None
    _enc_sym_raw(buf, raw)


def _enc_char(buf: bytearray, value: str) -> None:
    buf.append(0x73)
    buf += _I.pack(ord(value))


def _enc_uuid(buf: bytearray, value: uuid.UUID) -> None:
    buf.append(0x98)
    buf += value.bytes


def _enc_decimal(code: int) -> Encoder:
    def enc(buf: bytearray, value: bytes) -> None:
        buf.append(code)
        buf += value

    return enc


def _compound(buf: bytearray, small: int, large: int, count: int, body: bytes | bytearray) -> None:
    size = len(body)
    if size + 1 < 256 and count < 256:
        buf += _BBB.pack(small, size + 1, count)
    else:
        buf += _BII.pack(large, size + 4, count)
    buf += body


def encode_list(buf: bytearray, items: list[Any] | tuple[Any, ...]) -> None:
    """Append ``items`` as an AMQP list (list0 when empty)."""
    if not items:
        buf.append(0x45)
        return
    body = bytearray()
    for item in items:
        encode_into(body, item)
    _compound(buf, 0xC0, 0xD0, len(items), body)


def _enc_map(buf: bytearray, value: dict[Any, Any]) -> None:
    body = bytearray()
    for key, item in value.items():
        encode_into(body, key)
        encode_into(body, item)
    _compound(buf, 0xC1, 0xD1, 2 * len(value), body)


def _enc_described(buf: bytearray, value: Described) -> None:
    buf.append(0x00)
    encode_into(buf, value.descriptor)
    encode_into(buf, value.value)


# Element encodings for arrays: (constructor code, body-only encoder). One constructor for all items.
def _elem_fixed(st: struct.Struct) -> Encoder:
    pack = st.pack

    def enc(buf: bytearray, value: Any) -> None:
        buf += pack(value)

    return enc


def _elem_variable(buf: bytearray, raw: bytes) -> None:
    buf += _I.pack(len(raw))
    buf += raw


def _elem_variable8(buf: bytearray, raw: bytes) -> None:
    buf.append(len(raw))
    buf += raw


_SMALL_VARIABLE = {"binary": 0xA0, "string": 0xA1, "symbol": 0xA3}
_TEXT_CODECS = {"binary": "", "string": "utf-8", "symbol": "ascii"}


def _elem_via(full: Encoder) -> Encoder:
    """Encode with ``full`` and drop its constructor byte (for compound elements)."""

    def enc(buf: bytearray, value: Any) -> None:
        tmp = bytearray()
        full(tmp, value)
        buf += tmp[1:]

    return enc


def _list32(buf: bytearray, items: list[Any]) -> None:
    body = bytearray()
    for item in items:
        encode_into(body, item)
    buf += _BII.pack(0xD0, len(body) + 4, len(items))
    buf += body


def _map32(buf: bytearray, value: dict[Any, Any]) -> None:
    body = bytearray()
    for key, item in value.items():
        encode_into(body, key)
        encode_into(body, item)
    buf += _BII.pack(0xD1, len(body) + 4, 2 * len(value))
    buf += body


_ARRAY_ELEMENTS: dict[str, tuple[int, Encoder]] = {
    "null": (0x40, lambda buf, value: None),
    "boolean": (0x56, lambda buf, value: buf.append(1 if value else 0)),
    "ubyte": (0x50, _elem_fixed(_B)),
    "ushort": (0x60, _elem_fixed(_H)),
    "uint": (0x70, _elem_fixed(_I)),
    "ulong": (0x80, _elem_fixed(_Q)),
    "byte": (0x51, _elem_fixed(_b)),
    "short": (0x61, _elem_fixed(_h)),
    "int": (0x71, _elem_fixed(_i)),
    "long": (0x81, _elem_fixed(_q)),
    "float": (0x72, _elem_fixed(_f)),
    "double": (0x82, _elem_fixed(_d)),
    "decimal32": (0x74, lambda buf, value: buf.extend(value)),
    "decimal64": (0x84, lambda buf, value: buf.extend(value)),
    "decimal128": (0x94, lambda buf, value: buf.extend(value)),
    "char": (0x73, lambda buf, value: buf.extend(_I.pack(ord(value)))),
    "timestamp": (0x83, _elem_fixed(_q)),
    "uuid": (0x98, lambda buf, value: buf.extend(value.bytes)),
    "binary": (0xB0, _elem_variable),
    "string": (0xB1, lambda buf, value: _elem_variable(buf, value.encode("utf-8"))),
    "symbol": (0xB3, lambda buf, value: _elem_variable(buf, value.encode("ascii"))),
    "list": (0xD0, _elem_via(_list32)),
    "map": (0xD1, _elem_via(_map32)),
    "array": (0xF0, _elem_via(lambda buf, value: _enc_array(buf, value, wide=True))),
}


def _enc_array(buf: bytearray, value: Array, wide: bool = False) -> None:
    try:
        code, element = _ARRAY_ELEMENTS[value.type]
    except KeyError:
        raise EncodeError(f"arrays of {value.type!r} are not supported") from None
    body = bytearray()
    if value.descriptor is not None:
        body.append(0x00)
        encode_into(body, value.descriptor)
    items = value.items
    try:
        if value.descriptor is not None:
            items = [getattr(item, "described_value", lambda item=item: item)() for item in items]
        if value.type in _SMALL_VARIABLE:
            raws = [item.encode(_TEXT_CODECS[value.type]) if isinstance(item, str) else item for item in items]
            if all(len(raw) < 256 for raw in raws):
                code, items = _SMALL_VARIABLE[value.type], raws
                element = _elem_variable8
        body.append(code)
        for item in items:
            element(body, item)
    except (struct.error, AttributeError, TypeError, ValueError) as exc:
        raise EncodeError(f"array item does not fit type {value.type}: {exc}") from None
    count = len(items)
    # Decoders bound the count by the size (ours does, see the module docstring): only nulls can break it.
    if not wide and len(body) + 1 < 256 and count <= len(body) + 1:
        buf += _BBB.pack(0xE0, len(body) + 1, count)
    elif count <= len(body) + 4:
        buf += _BII.pack(0xF0, len(body) + 4, count)
    else:
        raise EncodeError(f"an array of {count} {value.type}s has more elements than bytes; decoders refuse it")
    buf += body


_enc_ulong = _enc_small_unsigned(0x80, 0x53, 0x44, _Q, 0xFFFFFFFFFFFFFFFF)
_enc_uint = _enc_small_unsigned(0x70, 0x52, 0x43, _I, 0xFFFFFFFF)

ENCODERS: dict[type, Encoder] = {
    type(None): _enc_null,
    bool: _enc_bool,
    UByte: _enc_fixed(0x50, _B),
    UShort: _enc_fixed(0x60, _H),
    UInt: _enc_uint,
    ULong: _enc_ulong,
    Byte: _enc_fixed(0x51, _b),
    Short: _enc_fixed(0x61, _h),
    Int: _enc_small_signed(0x71, 0x54, _i),
    Long: _enc_small_signed(0x81, 0x55, _q),
    int: _enc_int,
    Float: _enc_fixed(0x72, _f),
    float: _enc_fixed(0x82, _d),
    Decimal32: _enc_decimal(0x74),
    Decimal64: _enc_decimal(0x84),
    Decimal128: _enc_decimal(0x94),
    Char: _enc_char,
    Timestamp: _enc_fixed(0x83, _q),
    uuid.UUID: _enc_uuid,
    bytes: _enc_binary,
    bytearray: _enc_binary,
    memoryview: lambda buf, value: _enc_binary(buf, bytes(value)),
    str: _enc_string,
    Symbol: _enc_symbol,
    list: encode_list,
    tuple: encode_list,
    dict: _enc_map,
    Array: _enc_array,
    Described: _enc_described,
}

# Encoders by AMQP type name, for composite fields whose declared type fixes the encoding.
TYPED_ENCODERS: dict[str, Encoder] = {
    "null": _enc_null,
    "boolean": _enc_bool,
    "ubyte": ENCODERS[UByte],
    "ushort": ENCODERS[UShort],
    "uint": _enc_uint,
    "ulong": _enc_ulong,
    "byte": ENCODERS[Byte],
    "short": ENCODERS[Short],
    "int": ENCODERS[Int],
    "long": ENCODERS[Long],
    "float": ENCODERS[Float],
    "double": ENCODERS[float],
    "char": _enc_char,
    "timestamp": ENCODERS[Timestamp],
    "uuid": _enc_uuid,
    "binary": _enc_binary,
    "string": _enc_string,
    "symbol": _enc_symbol,
}


def encode_into(buf: bytearray, value: Any) -> None:
    """Append the AMQP encoding of ``value`` to ``buf``."""
    enc = ENCODERS.get(type(value))
    if enc is None:
        encode_composite = getattr(value, "encode_into", None)
        if encode_composite is not None:
            encode_composite(buf)
            return
        for kind in type(value).__mro__:  # a subclass (an IntEnum, a Symbol subclass): its nearest base
            enc = ENCODERS.get(kind)
            if enc is not None:
                break
        else:
            raise EncodeError(f"cannot encode {type(value).__name__} as AMQP")
    try:
        enc(buf, value)
    except (struct.error, OverflowError, UnicodeEncodeError) as exc:
        raise EncodeError(f"{value!r} does not fit its AMQP type: {exc}") from None


def encode(value: Any) -> bytes:
    """Return the AMQP encoding of ``value``."""
    buf = bytearray()
    encode_into(buf, value)
    return bytes(buf)
