"""Differential tests against python-qpid-proton's codec (``proton.Data``), the reference we interoperate with.

Proves, for hypothesis-drawn values of every AMQP type (nested lists, maps, arrays, described values and
every composite of ``definitions.py`` included): what we encode, proton decodes to the equal value, and
what proton encodes, we decode to the equal value. Values are compared, not bytes, because each encoder
may pick its own widths (proton writes list32/map32/array32 where we write list8/map8/array8). And a
message built by ``proton.Message`` decodes into the sections it was built from.

Where proton 0.40 itself goes wrong, only the direction it gets right is checked, and a test pins that we
read proton's bytes: a described value whose value is described (``proton_misreads``); maps with binary
keys, which ``Data.get_dict`` cannot hash (``read`` walks the tree instead); map keys that proton's Python
types merge, ``decimal32(0) == False`` (``write`` builds maps node by node).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import proton
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from proton import Data

from minibroker.amqp import definitions
from minibroker.amqp.codec import decode, decode_all, encode
from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
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
from tests.amqp.compare import assert_same
from tests.amqp.strategies import PRIMITIVES, amqp_values, composite

# Our Python type -> proton's, for scalars. Decimals: proton holds decimal32/64 as the integer of their bits.
TO_PROTON: dict[type, Any] = {
    type(None): lambda v: None,
    bool: bool,
    UByte: proton.ubyte,
    UShort: proton.ushort,
    UInt: proton.uint,
    ULong: proton.ulong,
    Byte: proton.byte,
    Short: proton.short,
    Int: proton.int32,
    Long: int,
    Timestamp: proton.timestamp,
    Float: proton.float32,
    float: float,
    Decimal32: lambda v: proton.decimal32(int.from_bytes(v, "big")),
    Decimal64: lambda v: proton.decimal64(int.from_bytes(v, "big")),
    Decimal128: lambda v: proton.decimal128(bytes(v)),
    Char: proton.char,
    uuid.UUID: lambda v: v,
    bytes: bytes,
    str: str,
    Symbol: proton.symbol,
}
FROM_PROTON: dict[type, Any] = {
    type(None): lambda v: None,
    bool: bool,
    proton.ubyte: UByte,
    proton.ushort: UShort,
    proton.uint: UInt,
    proton.ulong: ULong,
    proton.byte: Byte,
    proton.short: Short,
    proton.int32: Int,
    int: Long,
    proton.timestamp: Timestamp,
    proton.float32: Float,
    float: float,
    proton.decimal32: lambda v: Decimal32(int(v).to_bytes(4, "big")),
    proton.decimal64: lambda v: Decimal64(int(v).to_bytes(8, "big")),
    proton.decimal128: lambda v: Decimal128(bytes(v)),
    proton.char: Char,
    uuid.UUID: lambda v: v,
    bytes: bytes,
    str: str,
    proton.symbol: Symbol,
}
ARRAY_TYPES: dict[str, int] = {
    "null": Data.NULL,
    "boolean": Data.BOOL,
    "ubyte": Data.UBYTE,
    "ushort": Data.USHORT,
    "uint": Data.UINT,
    "ulong": Data.ULONG,
    "byte": Data.BYTE,
    "short": Data.SHORT,
    "int": Data.INT,
    "long": Data.LONG,
    "float": Data.FLOAT,
    "double": Data.DOUBLE,
    "decimal32": Data.DECIMAL32,
    "decimal64": Data.DECIMAL64,
    "decimal128": Data.DECIMAL128,
    "char": Data.CHAR,
    "timestamp": Data.TIMESTAMP,
    "uuid": Data.UUID,
    "binary": Data.BINARY,
    "string": Data.STRING,
    "symbol": Data.SYMBOL,
    "list": Data.LIST,
    "map": Data.MAP,
    "array": Data.ARRAY,
}
ARRAY_NAMES = {code: name for name, code in ARRAY_TYPES.items()}


def to_proton(value: Any) -> Any:
    """Our value as the Python object proton's ``Data.put_object`` encodes as the same AMQP value."""
    if isinstance(value, list):
        return [to_proton(v) for v in value]
    if isinstance(value, dict):
        converted = {to_proton(k): to_proton(v) for k, v in value.items()}
        if len(converted) != len(value):
            raise KeysMerged(value)
        return converted
    if isinstance(value, Described):
        return proton.Described(to_proton(value.descriptor), to_proton(value.value))
    if isinstance(value, Array):
        descriptor = proton.UNDESCRIBED if value.descriptor is None else to_proton(value.descriptor)
        return proton.Array(descriptor, ARRAY_TYPES[value.type], *(to_proton(v) for v in value.items))
    if isinstance(value, Composite | DescribedSection):
        return to_proton(undescribed(value))
    return TO_PROTON[type(value)](value)


class KeysMerged(Exception):
    """Proton's Python types merge map keys that ours keep apart: ``decimal32(0) == False``."""


def write(d: Data, value: Any) -> None:
    """Put our ``value`` at ``d``'s cursor, building proton's tree node by node (maps too: see KeysMerged)."""
    if isinstance(value, list):
        d.put_list()
        children: list[Any] = value
    elif isinstance(value, dict):
        d.put_map()
        children = [x for item in value.items() for x in item]
    elif isinstance(value, Described):
        d.put_described()
        children = [value.descriptor, value.value]
    elif isinstance(value, Array):
        d.put_array(value.descriptor is not None, ARRAY_TYPES[value.type])
        children = ([] if value.descriptor is None else [value.descriptor]) + value.items
    elif isinstance(value, Composite | DescribedSection):
        write(d, undescribed(value))
        return
    else:
        d.put_object(TO_PROTON[type(value)](value))
        return
    d.enter()
    for child in children:
        write(d, child)
    d.exit()


def read(d: Data) -> Any:
    """The value at ``d``'s cursor as ours, walking proton's tree itself.

    Not ``Data.get_object``: its maps cannot hold binary keys (it hashes proton's memoryview of them).
    """
    kind = d.type()
    if kind in (Data.LIST, Data.MAP):
        items = list(children(d))
        return items if kind == Data.LIST else dict(zip(items[::2], items[1::2], strict=True))
    if kind == Data.DESCRIBED:
        descriptor, value = children(d)
        return Described(descriptor, value)
    if kind == Data.ARRAY:
        _, described, element_type = d.get_array()
        items = list(children(d))
        descriptor = items.pop(0) if described else None
        return Array(ARRAY_NAMES[element_type], items, descriptor)
    if kind == Data.BINARY:
        return bytes(d.get_binary())  # a view of proton's memory: copy it while ``d`` lives
    value = d.get_object()
    return FROM_PROTON[type(value)](value)


def children(d: Data) -> Iterator[Any]:
    d.enter()
    try:
        while d.next() is not None:
            yield read(d)
    finally:
        d.exit()


def undescribed(value: Composite | DescribedSection) -> Described:
    """A composite as the generic described list its encoding carries: typed fields, trailing nulls trimmed."""
    if isinstance(value, DescribedSection):
        return Described(ULong(value.DESCRIPTOR_CODE), value.value)
    fields = [
        Array(spec.type, list(v)) if spec.multiple and v is not None else v
        for spec, v in zip(value.FIELDS, value.field_values(), strict=True)
    ]
    while fields and fields[-1] is None:
        fields.pop()
    return Described(ULong(value.DESCRIPTOR_CODE), fields)


def proton_decode(data: bytes) -> Any:
    """Decode one value with proton (it must consume all of ``data``) and return it as ours."""
    d = Data()
    assert d.decode(data) == len(data)
    d.rewind()
    assert d.next() is not None
    return read(d)


def proton_encode(value: Any) -> bytes:
    """Our ``value`` encoded by proton."""
    d = Data()
    write(d, value)
    return bytes(d.encode())


def check_both_ways(value: Any, expected: Any) -> None:
    """Ours -> proton gives ``expected``; proton -> ours gives ``value`` back."""
    if not proton_misreads(value):
        assert_same(proton_decode(encode(value)), expected)
    assert_same(decode(proton_encode(value))[0], value)


def proton_misreads(value: Any) -> bool:
    """Whether ``value`` holds what proton 0.40's decoder gets wrong, even when proton encoded it itself.

    That is a described value whose value is described: proton misplaces whatever follows it (it reads
    ``[[@a @b null], 1]`` as ``[[@a @b null, 1]]``). test_proton_encodes_what_it_misreads shows that we
    read proton's own bytes of such values correctly.
    """
    if isinstance(value, Composite | DescribedSection):
        value = undescribed(value)
    if isinstance(value, Described):
        inner = value.value
        return isinstance(inner, Described | Composite | DescribedSection) or any(
            map(proton_misreads, (value.descriptor, inner))
        )
    if isinstance(value, Array):
        return proton_misreads(value.descriptor) or any(map(proton_misreads, value.items))
    if isinstance(value, list):
        return any(map(proton_misreads, value))
    if isinstance(value, dict):
        return any(proton_misreads(k) or proton_misreads(v) for k, v in value.items())
    return False


@pytest.mark.parametrize("type_name", list(PRIMITIVES))
@settings(deadline=None, max_examples=25)
@given(data=st.data())
def test_primitive(type_name: str, data: st.DataObject) -> None:
    value = data.draw(PRIMITIVES[type_name])
    check_both_ways(value, value)


@settings(deadline=None, max_examples=150)
@given(amqp_values())
def test_nested_values(value: Any) -> None:
    check_both_ways(value, value)


@pytest.mark.parametrize("cls", definitions.ALL_TYPES, ids=lambda cls: cls.__name__)
@settings(deadline=None, max_examples=8)
@given(data=st.data())
def test_composite(cls: type[Any], data: st.DataObject) -> None:
    value = data.draw(composite(cls))
    check_both_ways(value, undescribed(value))


def test_the_converters_keep_amqp_types_apart() -> None:
    # guards the tables above: a mistake there would make both directions agree on the wrong type
    assert proton_encode(UInt(1)) == encode(UInt(1)) == b"\x52\x01"
    assert proton_encode(Long(1)) == encode(Long(1)) == b"\x55\x01"
    assert proton_encode(Symbol("a")) == encode(Symbol("a")) == b"\xa3\x01a"
    assert proton_encode(Decimal32(b"\x01\x02\x03\x04")) == b"\x74\x01\x02\x03\x04"
    assert type(proton_decode(b"\x71\x00\x00\x00\x01")) is Int
    keys_apart = {False: None, Decimal32(bytes(4)): None}  # to_proton would merge them
    assert_same(decode(proton_encode(keys_apart))[0], keys_apart)


@settings(deadline=None, max_examples=60)
@given(
    message_id=st.none() | PRIMITIVES["ulong"] | PRIMITIVES["uuid"] | PRIMITIVES["binary"] | PRIMITIVES["string"],
    subject=st.none() | st.text(st.characters(codec="utf-8", exclude_characters="\x00")),  # a C string in proton
    durable=st.booleans(),
    priority=st.integers(0, 255),
    properties=st.dictionaries(st.text(max_size=8), PRIMITIVES["long"] | PRIMITIVES["string"], max_size=4),
    body=amqp_values(max_leaves=6),
)
def test_proton_message_decodes_into_its_sections(
    message_id: Any, subject: str | None, durable: bool, priority: int, properties: dict[str, Any], body: Any
) -> None:
    try:
        proton_body = to_proton(body)
    except KeysMerged:
        reject()
    message = proton.Message(
        id=to_proton(message_id),
        subject=subject,
        durable=durable,
        priority=priority,
        properties=to_proton(properties),
        body=proton_body,
    )
    sections = {type(section): section for section in decode_all(message.encode())}
    header = sections.get(definitions.Header, definitions.Header())
    # proton leaves out fields that hold the spec's default (durable false, priority 4)
    assert (header.durable or False) is durable
    assert_same(header.priority if header.priority is not None else UByte(4), UByte(priority))
    message_properties = sections[definitions.Properties]
    assert_same(message_properties.message_id, message_id)
    assert_same(message_properties.subject, subject)
    if properties:
        assert_same(sections[definitions.ApplicationProperties].value, properties)
    if body is not None or definitions.AmqpValue in sections:  # proton leaves out a null body
        assert_same(sections[definitions.AmqpValue].value, body)


def test_an_array_of_more_nulls_than_bytes_is_refused_on_purpose() -> None:
    # The one encoding proton writes that we refuse: our decoder bounds every count by the bytes that carry
    # it (the defence against hostile counts, see test_decode_robustness), and nulls take no bytes.
    five, six = (proton_encode(Array("null", [None] * n)) for n in (5, 6))
    assert_same(decode(five)[0], Array("null", [None] * 5))
    assert six == bytes.fromhex("f0 00000005 00000006 40")
    with pytest.raises(DecodeError, match="does not fit its size"):
        decode(six)


NESTED = Described(Symbol("a"), Described(Symbol("b"), None))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param([NESTED, Long(1)], id="in-a-list"),
        pytest.param({NESTED: None, Long(1): None}, id="as-a-map-key"),
        pytest.param(Array("list", [[NESTED], [Long(1)]]), id="in-an-array"),
    ],
)
def test_proton_encodes_what_it_misreads(value: Any) -> None:
    assert proton_misreads(value)
    assert_same(decode(proton_encode(value))[0], value)
