"""Round trips through the codec, for values of every AMQP type drawn by hypothesis.

Proves: ``decode(encode(v))`` is ``v`` with the same AMQP type at every level (``same``, NaN-aware) for
every primitive type, for arrays of every element type (described ones too), for nested lists, maps and
described values; ``encode(decode(b)) == b`` for canonical encodings, i.e. the bytes our encoder writes;
and a sequence of values decodes back value by value with ``decode_all``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp.codec import decode, decode_all, encode
from minibroker.amqp.types import Float, Long, Symbol, UInt
from tests.amqp.compare import assert_same, same
from tests.amqp.strategies import PRIMITIVES, amqp_values, arrays, described


@pytest.mark.parametrize("type_name", list(PRIMITIVES))
@settings(deadline=None, max_examples=25)
@given(data=st.data())
def test_primitive_round_trip(type_name: str, data: st.DataObject) -> None:
    value = data.draw(PRIMITIVES[type_name])
    encoded = encode(value)
    decoded, end = decode(encoded)
    assert end == len(encoded)
    assert_same(decoded, value)
    assert encode(decoded) == encoded


@settings(deadline=None, max_examples=100)
@given(arrays(amqp_values(max_leaves=4)))
def test_array_round_trip(value: Any) -> None:
    encoded = encode(value)
    assert_same(decode(encoded), (value, len(encoded)))


@settings(deadline=None, max_examples=60)
@given(described(amqp_values(max_leaves=4)))
def test_described_round_trip(value: Any) -> None:
    encoded = encode(value)
    assert_same(decode(encoded), (value, len(encoded)))


@settings(deadline=None, max_examples=200)
@given(amqp_values())
def test_nested_value_round_trip(value: Any) -> None:
    encoded = encode(value)
    decoded, end = decode(encoded)
    assert end == len(encoded)
    assert_same(decoded, value)
    assert encode(decoded) == encoded  # canonical bytes come back unchanged


@settings(deadline=None, max_examples=50)
@given(st.lists(amqp_values(max_leaves=4), max_size=5))
def test_sequence_round_trip(values: list[Any]) -> None:
    assert_same(decode_all(b"".join(encode(v) for v in values)), values)


def test_same_tells_amqp_types_apart() -> None:
    # the comparison the round trips rely on must not be Python's lenient ==
    assert not same(UInt(1), Long(1))
    assert not same(Symbol("a"), "a")
    assert not same(0.0, -0.0)
    assert not same(Float(1.0), 1.0)
    assert not same([UInt(1)], [Long(1)])
    assert not same({Symbol("a"): 1}, {"a": 1})
    assert same(float("nan"), float("nan"))
    assert same((Float("nan"), 1), (Float("nan"), 1))
    assert same({Symbol("a"): [UInt(1)]}, {Symbol("a"): [UInt(1)]})
