"""Python representations of the AMQP 1.0 primitive types (Part 1 §1.6).

Theory of operation: a value's Python type says how it is encoded, so a decoded value encodes back to
the same AMQP type. The natural Python types map as

    None -> null, bool -> boolean, int -> long, float -> double, str -> string, bytes -> binary,
    uuid.UUID -> uuid, list -> list, dict -> map

and every other AMQP type has a thin subclass here (``UInt(5)`` is an ``int`` that encodes as uint).
The decoder always returns these subclasses where the natural mapping would lose the type, so a
round trip preserves it. Widths (uint0/smalluint/uint, str8/str32, ...) are an encoder choice, not a
type: the encoder picks the most compact one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


class DecodeError(Exception):
    """Bytes that are not a valid AMQP encoding (condition ``amqp:decode-error``)."""


class EncodeError(Exception):
    """A Python value that cannot be encoded as the AMQP type asked for (our code's fault)."""


class _Ranged(int):
    """An integer type with a fixed range."""

    __slots__ = ()
    LOW: int = 0
    HIGH: int = 0

    def __new__(cls, value: int = 0) -> _Ranged:
        if not cls.LOW <= value <= cls.HIGH:
            raise EncodeError(f"{value} is out of range for {cls.__name__.lower()}")
        return int.__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class UByte(_Ranged):
    """AMQP ubyte: 8-bit unsigned integer."""

    __slots__ = ()
    HIGH = 0xFF


class UShort(_Ranged):
    """AMQP ushort: 16-bit unsigned integer."""

    __slots__ = ()
    HIGH = 0xFFFF


class UInt(_Ranged):
    """AMQP uint: 32-bit unsigned integer."""

    __slots__ = ()
    HIGH = 0xFFFFFFFF


class ULong(_Ranged):
    """AMQP ulong: 64-bit unsigned integer."""

    __slots__ = ()
    HIGH = 0xFFFFFFFFFFFFFFFF


class Byte(_Ranged):
    """AMQP byte: 8-bit two's-complement integer."""

    __slots__ = ()
    LOW, HIGH = -0x80, 0x7F


class Short(_Ranged):
    """AMQP short: 16-bit two's-complement integer."""

    __slots__ = ()
    LOW, HIGH = -0x8000, 0x7FFF


class Int(_Ranged):
    """AMQP int: 32-bit two's-complement integer."""

    __slots__ = ()
    LOW, HIGH = -0x80000000, 0x7FFFFFFF


class Long(_Ranged):
    """AMQP long: 64-bit two's-complement integer (plain ``int`` encodes as this too)."""

    __slots__ = ()
    LOW, HIGH = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Timestamp(_Ranged):
    """AMQP timestamp: milliseconds since the Unix epoch, 64-bit signed."""

    __slots__ = ()
    LOW, HIGH = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Float(float):
    """AMQP float: IEEE 754 binary32 (plain ``float`` encodes as double)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


class Char(str):
    """AMQP char: one Unicode code point (UTF-32)."""

    __slots__ = ()

    def __new__(cls, value: str) -> Char:
        if len(value) != 1:
            raise EncodeError(f"char needs exactly one code point, got {value!r}")
        return str.__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str(self)!r})"


class Symbol(str):
    """AMQP symbol: a string of ASCII characters naming something."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str(self)!r})"


class _Decimal(bytes):
    """IEEE 754 decimal kept as its raw big-endian bytes (the broker never computes with it)."""

    WIDTH = 0

    def __new__(cls, value: bytes) -> _Decimal:
        if len(value) != cls.WIDTH:
            raise EncodeError(f"{cls.__name__.lower()} needs {cls.WIDTH} bytes, got {len(value)}")
        return bytes.__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({bytes(self)!r})"


class Decimal32(_Decimal):
    """AMQP decimal32 (raw bytes)."""

    WIDTH = 4


class Decimal64(_Decimal):
    """AMQP decimal64 (raw bytes)."""

    WIDTH = 8


class Decimal128(_Decimal):
    """AMQP decimal128 (raw bytes)."""

    WIDTH = 16


@dataclass(frozen=True, slots=True)
class Described:
    """A described value whose descriptor we hold no composite class for (Part 1 §1.2)."""

    descriptor: Any
    value: Any


@dataclass(slots=True)
class Array:
    """AMQP array: items that all share one constructor (Part 1 §1.6.23).

    ``type`` names the element type ("uint", "symbol", ...); for an array of described values,
    ``descriptor`` is their shared descriptor and ``type`` the type of their underlying values.
    """

    type: str
    items: list[Any] = field(default_factory=list)
    descriptor: Any = None


UUID = uuid.UUID
