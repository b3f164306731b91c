"""Python types of the field-table values that have no natural Python type of their own.

Theory of operation: a value's Python type says which field type it is written as, so a decoded table writes
back byte for byte. The natural types map as (RabbitMQ's errata to 0-9-1 §4.2.1 and its
``rabbit_binary_parser``):

    bool -> t, int -> l (signed 64-bit), float -> d, str -> S, bytes -> x, decimal.Decimal -> D,
    dict -> F, list -> A, None -> V

``l`` (and ``L``, which RabbitMQ reads as ``l`` too) is a plain ``int``, signed 64-bit; the other integer and
float types are the thin subclasses below (``UShort(5)`` is an ``int`` written as
``u``). ``S`` values are strings decoded as UTF-8 with ``surrogateescape``, so a peer's bytes that are not UTF-8
survive a round trip unchanged.
"""

from __future__ import annotations

from minibroker.amqp091.errors import EncodeError


class _Ranged(int):
    """An integer field type with a fixed range."""

    __slots__ = ()
    LOW = 0
    HIGH = 0
    TAG = b""

    def __new__(cls, value: int = 0) -> _Ranged:
        if not cls.LOW <= value <= cls.HIGH:
            raise EncodeError(f"{value} is out of range for {cls.__name__}")
        return int.__new__(cls, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class Byte(_Ranged):
    """``b``: signed 8-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = -(2**7), 2**7 - 1, b"b"


class UByte(_Ranged):
    """``B``: unsigned 8-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = 0, 2**8 - 1, b"B"


class Short(_Ranged):
    """``s``: signed 16-bit (RabbitMQ's errata; the 0-9-1 grammar's ``s`` is a short string nobody sends)."""

    __slots__ = ()
    LOW, HIGH, TAG = -(2**15), 2**15 - 1, b"s"


class UShort(_Ranged):
    """``u``: unsigned 16-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = 0, 2**16 - 1, b"u"


class Int(_Ranged):
    """``I``: signed 32-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = -(2**31), 2**31 - 1, b"I"


class UInt(_Ranged):
    """``i``: unsigned 32-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = 0, 2**32 - 1, b"i"


class Timestamp(_Ranged):
    """``T``: seconds since the epoch, unsigned 64-bit."""

    __slots__ = ()
    LOW, HIGH, TAG = 0, 2**64 - 1, b"T"


class Float(float):
    """``f``: IEEE-754 single precision (a plain ``float`` is written as ``d``, double precision)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


RANGED: tuple[type[_Ranged], ...] = (Byte, UByte, Short, UShort, Int, UInt, Timestamp)
