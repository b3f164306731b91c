"""The decoder's safety invariant: whatever the bytes, ``decode`` returns a value or raises ``DecodeError``.

Never ``IndexError``, ``struct.error``, ``UnicodeDecodeError``, ``RecursionError``, ``MemoryError``, nor a
hang. Proves it for arbitrary bytes (as ``bytes``, ``bytearray`` and ``memoryview``), for valid encodings
with bytes flipped, inserted or deleted, for every truncation of a valid encoding (always detected, since
the encoding is self-delimiting), and for hostile counts and sizes that would make a naive decoder loop
or allocate for ever. Anything that does decode re-encodes to bytes that decode to the same value.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.amqp import definitions  # noqa: F401  (registers the composites the decoder builds)
from minibroker.amqp.codec import decode, decode_all, encode
from minibroker.amqp.types import DecodeError
from tests.amqp.compare import assert_same
from tests.amqp.strategies import amqp_values, composites


def decodes_or_raises_decode_error(data: bytes | bytearray | memoryview) -> None:
    """Decode ``data``: a DecodeError is fine, any other exception fails the test."""
    try:
        value, end = decode(data)
    except DecodeError:
        return
    assert 0 < end <= len(data)
    # what we accept we can write back, and it means the same thing
    assert_same(decode(encode(value))[0], value)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64))
def test_arbitrary_bytes(data: bytes) -> None:
    decodes_or_raises_decode_error(data)
    decodes_or_raises_decode_error(bytearray(data))
    decodes_or_raises_decode_error(memoryview(data))
    with contextlib.suppress(DecodeError):
        decode_all(data)


# Bytes that start like an AMQP value: a constructor, then whatever. Reaches deeper than random bytes.
CONSTRUCTORS = st.sampled_from(list(bytes.fromhex("00 40 56 52 70 73 98 a0 a1 a3 b0 b1 b3 45 c0 c1 d0 d1 e0 f0")))


@settings(deadline=None, max_examples=200)
@given(st.lists(CONSTRUCTORS | st.integers(0, 255), min_size=1, max_size=40))
def test_constructor_soup(octets: list[int]) -> None:
    decodes_or_raises_decode_error(bytes(octets))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid encoding with a few octets flipped, inserted or deleted."""
    data = bytearray(encode(draw(amqp_values(max_leaves=6) | composites())))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "set-to-extreme"]))
        if action == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data.insert(i, draw(st.integers(0, 255)))
        elif action == "delete" and len(data) > 1:
            del data[i]
        else:
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
    return bytes(data)


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_encodings(data: bytes) -> None:
    decodes_or_raises_decode_error(data)


@settings(deadline=None, max_examples=100)
@given(amqp_values(max_leaves=8) | composites())
def test_every_truncation_is_detected(value: Any) -> None:
    encoded = encode(value)
    for cut in range(len(encoded)):
        with pytest.raises(DecodeError):
            decode(encoded[:cut])


HOSTILE = [
    pytest.param("f0 00000005 ffffffff 40", id="array32-of-2^32-1-nulls"),
    pytest.param("f0 00000005 ffffffff 45", id="array32-of-2^32-1-empty-lists"),
    pytest.param("f0 00000005 ffffffff 43", id="array32-of-2^32-1-uint0"),
    pytest.param("e0 02 ff 41", id="array8-of-255-trues"),
    pytest.param("f0 ffffffff ffffffff 40", id="array32-size-past-the-end"),
    pytest.param("d0 00000004 ffffffff", id="list32-of-2^32-1-items"),
    pytest.param("d0 ffffffff ffffffff " + "40" * 64, id="list32-size-past-the-end"),
    pytest.param("d1 00000004 fffffffe", id="map32-of-2^31-1-pairs"),
    pytest.param("b0 ffffffff " + "00" * 64, id="vbin32-of-4GiB"),
    pytest.param("b1 ffffffff " + "00" * 64, id="str32-of-4GiB"),
    pytest.param("b3 ffffffff " + "00" * 64, id="sym32-of-4GiB"),
    pytest.param("f0 0000000e 00000001  f0 00000005 ffffffff 40", id="array-of-hostile-array"),
    pytest.param("00" * 200_000 + "40", id="200k-nested-descriptors"),
    pytest.param("c0 ff 01 " * 100_000, id="100k-nested-lists"),
    pytest.param("e0 ff 01 f0 " * 100_000, id="array-of-array-claiming-4GiB"),
    pytest.param("c1 ff 02 " * 100_000, id="100k-nested-map-keys"),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("hex", HOSTILE)
def test_hostile_counts_and_sizes_are_rejected_quickly(hex: str) -> None:
    data = bytes.fromhex(hex)
    start = time.perf_counter()
    with pytest.raises(DecodeError):
        decode(data)
    assert time.perf_counter() - start < 1.0
