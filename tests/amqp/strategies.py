"""Hypothesis strategies for every AMQP 1.0 type, reusable by any test that needs AMQP values.

Every strategy draws values *as the decoder returns them* (``Long(5)``, never a plain ``5``; ``list``,
never a ``tuple``), so ``same(decode(encode(v)), v)`` is the round-trip property with no normalising step.

    PRIMITIVES["uint"]      one strategy per primitive type name of Part 1 §1.6 (null ... symbol)
    scalars(), map_keys()   any primitive; any primitive usable as a map key (no NaN)
    descriptors()           symbols and ulongs that no composite class claims
    arrays(children)        arrays of any element type, arrays of arrays, lists and maps, described arrays
    described(children)     described values whose descriptor has no composite class
    amqp_values()           any of the above, nested through lists, maps, arrays and described values
    composite(cls)          instances of one class of ``definitions.py``, fields of their declared types
    composites()            instances of any class of ``definitions.py``

The factories are cached: hypothesis draws much faster from one strategy object than from a new one
per example (``data.draw(composite(cls))`` inside a test stays cheap).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from minibroker.amqp import codec, definitions
from minibroker.amqp.composite import Composite, DescribedSection, FieldSpec
from minibroker.amqp.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
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

Strategy = st.SearchStrategy[Any]


def _short_or_long(short: st.SearchStrategy[Any], long: st.SearchStrategy[Any]) -> Strategy:
    """Mostly short values, sometimes ones past 255 bytes, so both 8- and 32-bit widths get exercised."""
    return st.one_of(short, short, short, long)


_ASCII = st.characters(max_codepoint=0x7F)

PRIMITIVES: dict[str, Strategy] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "ubyte": st.integers(0, UByte.HIGH).map(UByte),
    "ushort": st.integers(0, UShort.HIGH).map(UShort),
    "uint": st.integers(0, UInt.HIGH).map(UInt),
    "ulong": st.integers(0, ULong.HIGH).map(ULong),
    "byte": st.integers(Byte.LOW, Byte.HIGH).map(Byte),
    "short": st.integers(Short.LOW, Short.HIGH).map(Short),
    "int": st.integers(Int.LOW, Int.HIGH).map(Int),
    "long": st.integers(Long.LOW, Long.HIGH).map(Long),
    "float": st.floats(width=32).map(Float),
    "double": st.floats(),
    "decimal32": st.binary(min_size=4, max_size=4).map(Decimal32),
    "decimal64": st.binary(min_size=8, max_size=8).map(Decimal64),
    "decimal128": st.binary(min_size=16, max_size=16).map(Decimal128),
    "char": st.characters().map(Char),
    "timestamp": st.integers(Timestamp.LOW, Timestamp.HIGH).map(Timestamp),
    "uuid": st.uuids(),
    "binary": _short_or_long(st.binary(max_size=12), st.binary(min_size=250, max_size=300)),
    "string": _short_or_long(st.text(max_size=12), st.text(min_size=250, max_size=300)),
    "symbol": _short_or_long(st.text(_ASCII, max_size=12), st.text(_ASCII, min_size=250, max_size=300)).map(Symbol),
}
"""One strategy per primitive type (Part 1 §1.6), keyed by the spec's type name."""

SCALAR_TYPES = tuple(PRIMITIVES)


@cache
def scalars() -> Strategy:
    """Any primitive value (no list, map, array or described value)."""
    return st.one_of(*PRIMITIVES.values())


@cache
def map_keys() -> Strategy:
    """Scalars usable as dict keys whose equality is ordinary (no NaN)."""
    keys = dict(PRIMITIVES)
    keys["float"] = st.floats(width=32, allow_nan=False).map(Float)
    keys["double"] = st.floats(allow_nan=False)
    return st.one_of(*keys.values())


@cache
def descriptors() -> Strategy:
    """Descriptors (a symbol or a ulong, §1.2) that no composite class claims."""
    return st.one_of(st.text(_ASCII, max_size=10).map(Symbol), st.integers(0, ULong.HIGH).map(ULong)).filter(
        lambda d: d not in codec.DESCRIBED_TYPES
    )


def _array_of(type_name: str, items: Strategy) -> Strategy:
    # An array's elements take at least one byte each, except nulls: the decoder bounds the count by the
    # array's size, and an array32 of nulls has a size of 5 (see codec._enc_array).
    max_size = 5 if type_name == "null" else 6
    return st.builds(
        Array,
        st.just(type_name),
        st.lists(items, max_size=max_size),
        st.none() | descriptors(),
    )


@cache
def arrays(children: Strategy | None = None) -> Strategy:
    """Arrays of every element type; arrays of lists and maps draw their contents from ``children``."""
    children = scalars() if children is None else children
    flat = st.one_of(*(_array_of(name, items) for name, items in PRIMITIVES.items()))
    return st.one_of(
        flat,
        _array_of("list", st.lists(children, max_size=3)),
        _array_of("map", st.dictionaries(map_keys(), children, max_size=3)),
        _array_of("array", flat),
    )


@cache
def described(children: Strategy | None = None) -> Strategy:
    """Described values with an unclaimed descriptor (decoded as ``Described``)."""
    return st.builds(Described, descriptors(), scalars() if children is None else children)


@cache
def amqp_values(max_leaves: int = 12) -> Strategy:
    """Any AMQP value, nested through lists, maps, arrays and described values."""

    def extend(children: Strategy) -> Strategy:
        return st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(map_keys(), children, max_size=4),
            arrays(children),
            described(children),
        )

    return st.recursive(scalars(), extend, max_leaves=max_leaves)


# -- composites --------------------------------------------------------------------------------------
@cache
def field_values(spec: FieldSpec) -> Strategy:
    """Values of a composite field's declared type (a list of them for a multiple field)."""
    if spec.multiple:
        values = st.lists(PRIMITIVES[spec.type], max_size=3)
    elif spec.type == "*":
        values = amqp_values(max_leaves=4)
    elif spec.type == "fields":
        values = st.dictionaries(PRIMITIVES["symbol"], amqp_values(max_leaves=3), max_size=3)
    elif spec.type == "map":
        values = st.dictionaries(map_keys(), amqp_values(max_leaves=3), max_size=3)
    elif spec.type == "list":
        values = st.lists(amqp_values(max_leaves=3), max_size=3)
    else:
        values = PRIMITIVES[spec.type]
    return values.filter(lambda v: v is not None) if spec.mandatory else st.none() | values


_SECTION_VALUES: dict[str, Strategy] = {
    "binary": PRIMITIVES["binary"],
    "list": st.lists(amqp_values(max_leaves=4), max_size=4),
    "map": st.dictionaries(map_keys(), amqp_values(max_leaves=3), max_size=3),
    "fields": st.dictionaries(PRIMITIVES["symbol"], amqp_values(max_leaves=3), max_size=3),
    "*": amqp_values(max_leaves=6),
}


@cache
def composite(cls: type[Any]) -> Strategy:
    """Instances of one class from ``definitions.py``."""
    if issubclass(cls, DescribedSection):
        return st.builds(cls, _SECTION_VALUES[cls.SOURCE])
    assert issubclass(cls, Composite)
    return st.builds(cls, *(field_values(spec) for spec in cls.FIELDS))


@cache
def composites() -> Strategy:
    """An instance of any composite or message-section class in ``definitions.py``."""
    return st.one_of(*(composite(cls) for cls in definitions.ALL_TYPES))
