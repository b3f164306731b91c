"""A differential test: pika's own 0-9-1 codec (``pika.spec``, ``pika.data``) and ours read each other's bytes.

Every method and the basic content properties, both ways: what we encode pika decodes to the same field
values, and what pika encodes we decode to the same values. The field tables are limited to what pika reads
back faithfully (pika 1.x reads ``f`` and ``d`` as integers and ``T`` as a datetime, and writes ints as ``I``
or ``l``), so values are compared after forgetting our integer subtypes.
"""

from __future__ import annotations

import inspect
from datetime import datetime
from decimal import Decimal
from typing import Any

import pika.spec  # a test dependency (the ``test`` extras): never skipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp091 import definitions as d
from minibroker.amqp091 import values as v
from minibroker.amqp091.base import Method
from minibroker.amqp091.codec import decode_content_header, decode_method
from minibroker.amqp091.frames import HeaderFrame, encode_frame, encode_method_frame
from tests.amqp091.strategies import WIRE, shortstrs

METHOD_CLASSES = list(d.METHODS.values())
comparable = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        *(st.builds(kind, st.integers(max(kind.LOW, -(2**31)), min(kind.HIGH, 2**31 - 1))) for kind in v.RANGED),
        st.text(max_size=20),
        st.binary(max_size=20),
        st.none(),
        st.builds(lambda u, s: Decimal(u).scaleb(-s), st.integers(0, 2**31 - 1), st.integers(0, 20)),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(shortstrs, children, max_size=3),
    max_leaves=8,
)
PIKA_WIRE = {**WIRE, "table": st.dictionaries(shortstrs, comparable, max_size=4)}


def plain(value: Any) -> Any:
    """A value as pika holds it: our integer subtypes as ``int``, longstr bytes that are UTF-8 as ``str``."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, bytes) and isinstance(theirs, str):  # pika reads a longstr as str when it is UTF-8
        return ours == theirs.encode()
    if isinstance(theirs, datetime):  # pika reads T as a datetime
        return type(ours) is v.Timestamp and theirs.timestamp() == ours
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return list(ours) == list(theirs) and all(same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(same(a, b) for a, b in zip(ours, theirs, strict=True))
    # pika reads l as its ``long``, an int subclass: compare as ints, but a bool stays a bool
    return bool(plain(ours) == plain(theirs)) and isinstance(ours, bool) == isinstance(theirs, bool)


def pika_class(cls: type[Method]) -> Any:
    return pika.spec.methods[cls.CLASS_ID << 16 | cls.METHOD_ID]


def pika_values(instance: Any) -> list[Any]:
    """pika's field values in its constructor's order, which is the specification's field order."""
    names = list(inspect.signature(type(instance).__init__).parameters)[1:]
    return [getattr(instance, name) for name in names]


@pytest.mark.parametrize("cls", METHOD_CLASSES, ids=lambda c: c.NAME)
@settings(deadline=None, max_examples=10)
@given(data=st.data())
def test_pika_reads_our_methods_and_we_read_pikas(cls: type[Method], data: st.DataObject) -> None:
    ours = data.draw(st.builds(cls, **{name: PIKA_WIRE[wire] for name, wire in cls.FIELDS}))
    values = [getattr(ours, name) for name, _ in cls.FIELDS]
    payload = encode_method_frame(0, ours)[7:-1]
    theirs = pika_class(cls)()
    theirs.decode(payload, 4)
    got = pika_values(theirs)
    assert len(got) == len(values)
    for name, mine, pikas in zip([n for n, _ in cls.FIELDS], values, got, strict=True):
        assert same(mine, pikas), (name, mine, pikas)
    # and back: pika writes the same values, we read them
    written = pika_class(cls)(*[plain(value) for value in values])
    decoded = decode_method(pika_class(cls).INDEX.to_bytes(4, "big") + b"".join(written.encode()))
    for name, mine in zip([n for n, _ in cls.FIELDS], values, strict=True):
        assert plain(getattr(decoded, name)) == plain(mine), name


@settings(deadline=None, max_examples=100)
@given(data=st.data())
def test_pika_reads_our_properties_and_we_read_pikas(data: st.DataObject) -> None:
    specs = d.BasicProperties.PROPERTIES
    ours = data.draw(st.builds(d.BasicProperties, **{name: st.none() | PIKA_WIRE[wire] for name, wire in specs}))
    payload = encode_frame(HeaderFrame(1, 60, 7, ours))[7:-1]
    theirs = pika.spec.BasicProperties()
    theirs.decode(payload, 12)  # after class-id, weight and body size
    for (name, _), pikas in zip(specs, pika_values(theirs), strict=True):
        assert same(getattr(ours, name), pikas), name
    written = pika.spec.BasicProperties(*[plain(getattr(ours, name)) for name, _ in specs])
    _, size, decoded = decode_content_header(
        bytes.fromhex("003c0000") + (7).to_bytes(8, "big") + b"".join(written.encode())
    )
    assert size == 7
    for name, _ in specs:
        assert plain(getattr(decoded, name)) == plain(getattr(ours, name)), name
