"""Composite and described-restricted types (Part 1 §1.3, §1.4): the bases of the generated classes.

Theory of operation: every class in ``definitions.py`` (generated from the specification's XML) has a
field table, ``FIELDS``, in wire order. Encoding writes the descriptor then a list of the fields, each
with the encoding its declared type fixes (a ``handle`` field is a uint even when it holds a plain
``int``), with trailing nulls trimmed (§1.4: "the encoding MAY omit trailing null fields"). Decoding
checks the shape: the described value must be a list, mandatory fields must be present, and a present
field must hold a value of exactly its declared type (a uint field refuses a ulong, a string field a
symbol); otherwise ``DecodeError``. One leniency, because real clients need it: a symbol-keyed map (``fields``,
annotations) whose keys are strings instead of symbols (rhea, go-amqp and Azure's JavaScript SDK send an
error's ``info`` so) decodes, its string keys turned into symbols; keys of any other type are still refused.

Fields are all optional in the constructors (a missing mandatory field is a decode error, not a
constructor error), so a decoded list maps positionally onto the constructor. The generated classes are what
``@dataclass(slots=True)`` made of them before, written out (issue 19: building the dataclasses was the largest part
of the import): each class has its slots, ``__match_args__`` and ``__init__``; equality and ``repr`` are the
bases', as a dataclass's: equal when of the same class with equal field tuples, unhashable, ``Open(container_id=...,
hostname=None, ...)``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from minibroker.amqp import codec
from minibroker.amqp.types import (
    Array,
    Byte,
    Char,
    DecodeError,
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

# The Python type the decoder gives each AMQP type. Checked with ``type(x) is``, not ``isinstance``:
# ``UInt``, ``Long`` and ``bool`` are all ints, ``Symbol`` is a str, ``Float`` a float.
_PYTHON_TYPES: dict[str, type] = {
    "boolean": bool,
    "ubyte": UByte, "ushort": UShort, "uint": UInt, "ulong": ULong,
    "byte": Byte, "short": Short, "int": Int, "long": Long, "timestamp": Timestamp,
    "float": Float, "double": float,
    "string": str, "symbol": Symbol, "char": Char, "uuid": uuid.UUID,
    "binary": bytes,
    "map": dict, "fields": dict,
    "list": list,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a composite: its Python and spec names, its wire type, and its flags."""

    name: str
    amqp_name: str
    type: str
    """Primitive type name after resolving restricted types; "*" for any; "fields" for a symbol-keyed map."""
    mandatory: bool = False
    multiple: bool = False
    default: str | None = None
    """The specification's default, as written in the XML (None when it gives none)."""


class Composite:
    """Base of all generated composite types."""

    __slots__ = ()
    DESCRIPTOR_CODE: ClassVar[int]
    DESCRIPTOR_NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[FieldSpec, ...]]
    _CHECKS: ClassVar[tuple[tuple[int, FieldSpec, type | None], ...]]
    _DESCRIPTOR: ClassVar[bytes]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "DESCRIPTOR_CODE" not in cls.__dict__:
            return
        cls._DESCRIPTOR = b"\x00" + codec.encode(ULong(cls.DESCRIPTOR_CODE))
        cls._CHECKS = tuple((i, f, _PYTHON_TYPES.get(f.type)) for i, f in enumerate(cls.FIELDS))
        make = cls.from_described
        codec.DESCRIBED_TYPES[ULong(cls.DESCRIPTOR_CODE)] = make
        codec.DESCRIBED_TYPES[Symbol(cls.DESCRIPTOR_NAME)] = make

    def field_values(self) -> list[Any]:
        """The field values in wire order."""
        return [getattr(self, f.name) for f in self.FIELDS]

    def __eq__(self, other: object) -> bool:
        # as @dataclass's: the same class and equal fields, compared as sequences (identity first, so NaN is NaN)
        if not isinstance(other, Composite) or other.__class__ is not self.__class__:
            return NotImplemented
        return self.field_values() == other.field_values()

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value, as a @dataclass: unhashable

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self.FIELDS)
        return f"{self.__class__.__qualname__}({fields})"

    def encode_into(self, buf: bytearray) -> None:
        """Append the described-list encoding of this value, trailing nulls trimmed."""
        values = self.field_values()
        while values and values[-1] is None:
            values.pop()
        self._encode_values(buf, values)

    def encode_all_into(self, buf: bytearray) -> None:
        """Append the described-list encoding of this value with every field, trailing nulls included (§1.4 lets
        an encoder omit them, not every decoder cope: azure-eventhub 5.x ``_pyamqp/_decode.py`` ``decode_frame``
        reads performative fields by position without padding a short list). A composite in a field (the error
        of a detach, the rejected outcome of a disposition and its error) is written with every field too:
        azure-servicebus 7.15's ``_pyamqp/client.py`` ``SendClient._on_send_complete`` reads the rejected error's
        ``info`` by position, and a trimmed one made its send hang."""
        self._encode_values(buf, self.field_values(), _encode_field_all)

    def _encode_values(
        self, buf: bytearray, values: list[Any], encode_field: Callable[[bytearray, FieldSpec, Any], None] | None = None
    ) -> None:
        buf += self._DESCRIPTOR
        if not values:
            buf.append(0x45)
            return
        body = bytearray()
        encode = encode_field or _encode_field
        for spec, value in zip(self.FIELDS, values, strict=False):
            encode(body, spec, value)
        codec._compound(buf, 0xC0, 0xD0, len(values), body)

    def described_value(self) -> list[Any]:
        """The underlying list, with typed values, for use as an element of a described array."""
        return list(codec.decode(codec.encode(self)[len(self._DESCRIPTOR) :])[0])

    @classmethod
    def from_described(cls, value: Any) -> Self:
        """Build from the value of a described list; check mandatory fields and field types."""
        if not isinstance(value, list):
            raise DecodeError(f"{cls.DESCRIPTOR_NAME}: described value must be a list")
        n = len(cls.FIELDS)
        if len(value) < n:
            value = value + [None] * (n - len(value))
        for i, spec, kind in cls._CHECKS:
            item = value[i]
            if item is None:
                if spec.mandatory:
                    raise DecodeError(f"{cls.DESCRIPTOR_NAME}: mandatory field {spec.amqp_name} is null")
                continue
            items: list[Any]
            if spec.multiple:
                items = value[i] = list(item.items) if isinstance(item, Array) else [item]
            else:
                items = [item]
            if kind is not None:
                for one in items:
                    if type(one) is not kind:
                        raise DecodeError(
                            f"{cls.DESCRIPTOR_NAME}: field {spec.amqp_name} must be {spec.type}, "
                            f"got {type(one).__name__}"
                        )
                if spec.type == "fields" and not _symbol_keyed(item):
                    value[i] = _symbolized(item, f"{cls.DESCRIPTOR_NAME}: field {spec.amqp_name}")
        return cls(*value[:n])

    def __bytes__(self) -> bytes:
        return codec.encode(self)


class DescribedSection:
    """Base of the restricted types that carry a descriptor: the message sections (Part 3 §3.2)."""

    __slots__ = ()
    DESCRIPTOR_CODE: ClassVar[int]
    DESCRIPTOR_NAME: ClassVar[str]
    SOURCE: ClassVar[str]
    _DESCRIPTOR: ClassVar[bytes]
    value: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "DESCRIPTOR_CODE" not in cls.__dict__:
            return
        cls._DESCRIPTOR = b"\x00" + codec.encode(ULong(cls.DESCRIPTOR_CODE))
        make = cls.from_described
        codec.DESCRIBED_TYPES[ULong(cls.DESCRIPTOR_CODE)] = make
        codec.DESCRIBED_TYPES[Symbol(cls.DESCRIPTOR_NAME)] = make

    def __init__(self, value: Any) -> None:  # each generated class has its own, typed
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        # as @dataclass's (and Composite's): the same class and an equal value, identity first as in a tuple
        if not isinstance(other, DescribedSection) or other.__class__ is not self.__class__:
            return NotImplemented
        return (self.value,) == (other.value,)

    __hash__ = None  # type: ignore[assignment]  # as Composite's

    def __repr__(self) -> str:
        return f"{self.__class__.__qualname__}(value={self.value!r})"

    def encode_into(self, buf: bytearray) -> None:
        """Append descriptor and value, the value encoded as the section's source type."""
        buf += self._DESCRIPTOR
        _encode_field(buf, _SECTION_FIELD[self.SOURCE], self.value)

    def described_value(self) -> Any:
        """The underlying value, for use as an element of a described array."""
        return self.value

    @classmethod
    def from_described(cls, value: Any) -> Self:
        """Build from the described value, checking it has the section's source type."""
        kind = _PYTHON_TYPES.get(cls.SOURCE)
        if kind is not None and type(value) is not kind:
            raise DecodeError(f"{cls.DESCRIPTOR_NAME}: value must be {cls.SOURCE}")
        if cls.SOURCE == "fields" and not _symbol_keyed(value):
            value = _symbolized(value, f"{cls.DESCRIPTOR_NAME}: value")
        return cls(value)

    def __bytes__(self) -> bytes:
        return codec.encode(self)


def _symbol_keyed(value: Any) -> bool:
    # §2.8.13 fields: keys are symbols; §3.2.10 annotations: symbols or ulongs (filter-set and node-properties alike)
    return all(type(key) is Symbol or type(key) is ULong for key in value)


def _symbolized(value: dict[Any, Any], what: str) -> dict[Any, Any]:
    """``value`` with its string keys made symbols: leniency for clients that send a symbol-keyed map (an error's
    info, say) with string keys. A key of any other type, or a string no symbol can hold (not ASCII), is still a
    ``DecodeError``. (A string and a symbol spelled alike are one key already: ``Symbol`` is a ``str``.)"""
    keys = [Symbol(key) if type(key) is str and key.isascii() else key for key in value]
    if not all(type(key) is Symbol or type(key) is ULong for key in keys):
        raise DecodeError(f"{what} must be a map with symbol keys")
    items = zip(keys, value.values(), strict=True)
    strings = [key for key in value if type(key) is str]
    return SymbolizedFields(items, string_keys=strings) if strings else dict(items)


class SymbolizedFields(dict[Any, Any]):
    """A symbol-keyed map that arrived with string keys (the decoder's leniency), remembering which: a strict
    reader can still refuse what a lenient one accepts (Part 2 §2.8.13)."""

    __slots__ = ("string_keys",)

    def __init__(self, items: Any, *, string_keys: list[str]) -> None:
        super().__init__(items)
        self.string_keys = tuple(string_keys)
        """The keys as they were on the wire: strings, not symbols."""


_SECTION_FIELD = {kind: FieldSpec("value", "value", kind) for kind in ("binary", "list", "map", "fields", "*")}


def _encode_field_all(buf: bytearray, spec: FieldSpec, value: Any) -> None:
    """As ``_encode_field``, a composite value with every field (``Composite.encode_all_into``)."""
    if isinstance(value, Composite):
        value.encode_all_into(buf)
    else:
        _encode_field(buf, spec, value)


def _encode_field(buf: bytearray, spec: FieldSpec, value: Any) -> None:
    kind = spec.type
    if value is None:
        buf.append(0x40)
        return
    if spec.multiple and isinstance(value, list | tuple):
        if kind in codec.TYPED_ENCODERS:
            codec.encode_into(buf, Array(kind, list(value)))
        else:
            codec.encode_into(buf, list(value))
        return
    enc = codec.TYPED_ENCODERS.get(kind)
    try:
        if enc is not None:
            enc(buf, value)
        elif kind == "fields" and isinstance(value, dict):
            codec.encode_into(buf, {Symbol(k) if type(k) is str else k: v for k, v in value.items()})
        else:
            codec.encode_into(buf, value)
    except (TypeError, AttributeError, ValueError, OverflowError, struct.error) as exc:
        raise EncodeError(f"field {spec.amqp_name}: {value!r} is not a valid {kind}: {exc}") from None
