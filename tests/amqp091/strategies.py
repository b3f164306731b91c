"""Hypothesis strategies for AMQP 0-9-1 values, built from the generated classes' declared wire types."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from minibroker.amqp091 import values as v
from minibroker.amqp091.base import Method, Properties

shortstrs = st.text(max_size=60)  # at most 240 UTF-8 bytes: always a valid shortstr
decimals = st.builds(
    lambda unscaled, scale: Decimal(unscaled).scaleb(-scale), st.integers(0, 2**32 - 1), st.integers(0, 255)
)
scalars = st.one_of(
    st.booleans(),
    *(st.builds(kind, st.integers(kind.LOW, kind.HIGH)) for kind in v.RANGED),
    st.integers(-(2**63), 2**63 - 1),
    st.builds(v.Float, st.floats(width=32, allow_nan=False)),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.none(),
    decimals,
)
field_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(shortstrs, children, max_size=4),
    max_leaves=12,
)
tables = st.dictionaries(shortstrs, field_values, max_size=5)

WIRE: dict[str, st.SearchStrategy[Any]] = {
    "bit": st.booleans(),
    "octet": st.integers(0, 2**8 - 1),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1),
    "timestamp": st.integers(0, 2**64 - 1),
    "shortstr": shortstrs,
    "longstr": st.binary(max_size=40),
    "table": tables,
}


def method(cls: type[Method]) -> st.SearchStrategy[Method]:
    """Any instance of ``cls``, every field drawn from its wire type."""
    return st.builds(cls, **{name: WIRE[wire] for name, wire in cls.FIELDS})


def properties(cls: type[Properties]) -> st.SearchStrategy[Properties]:
    """Any instance of ``cls``, each property absent or drawn from its wire type."""
    return st.builds(cls, **{name: st.none() | WIRE[wire] for name, wire in cls.PROPERTIES})


def assert_same(got: Any, expected: Any) -> None:
    """Equal, and of the same Python type all the way down (``UInt(1) == 1``, but a round trip keeps ``UInt``)."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b)
    elif isinstance(expected, Decimal):
        assert got.as_tuple() == expected.as_tuple()
    elif isinstance(expected, Method | Properties):
        specs = expected.FIELDS if isinstance(expected, Method) else expected.PROPERTIES
        for name, _ in specs:
            assert_same(getattr(got, name), getattr(expected, name))
    else:
        assert got == expected
