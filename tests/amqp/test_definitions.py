"""The generated composites are the specification's, and they encode and decode as it says.

Proves: (a) ``definitions.py`` is exactly what ``tools/gen_definitions.py`` makes of ``spec/``; (b) an
independent reading of the XML finds a class for every described type, with the same descriptor name and
code, and the same fields in the same order with the same mandatory/multiple flags and types; (c) ``spec/``
is, byte for byte, the specification's XML (its files' SHA-256 digests are pinned here); (d) every composite
round-trips with any field values of its declared types, trailing null fields are trimmed (§1.4), a field is
encoded as its declared type even from a plain ``int``, a symbolic descriptor decodes to the same class as the
numeric one, and a missing mandatory field or a field of any other type is a ``DecodeError``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec, definitions
from minibroker.amqp.codec import decode, encode
from minibroker.amqp.composite import Composite, DescribedSection, FieldSpec
from minibroker.amqp.definitions import Attach, Begin, Close, Data, Open, Transfer
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
from tests.amqp.compare import assert_same
from tests.amqp.strategies import composite

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
NS = "{http://www.amqp.org/schema/amqp.xsd}"

ALL_TYPES: list[type[Any]] = list(definitions.ALL_TYPES)
COMPOSITES = [cls for cls in ALL_TYPES if issubclass(cls, Composite)]
SECTIONS = [cls for cls in ALL_TYPES if issubclass(cls, DescribedSection)]


def class_id(cls: type[Any]) -> str:
    return cls.__name__


# -- (a) the committed file is the generator's output ------------------------------------------------
def test_definitions_are_generated_from_the_spec() -> None:
    loader = importlib.util.spec_from_file_location("gen_definitions", ROOT / "tools/gen_definitions.py")
    assert loader is not None
    assert loader.loader is not None
    generator = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(generator)
    committed = (ROOT / "minibroker/amqp/definitions.py").read_text()
    assert generator.generate(SPEC) == committed, "python tools/gen_definitions.py > minibroker/amqp/definitions.py"


# -- (b) an independent reading of the XML -----------------------------------------------------------
XML_TYPE_LIST = [t for path in sorted(SPEC.glob("*.bare.xml")) for t in ET.parse(path).getroot().iter(f"{NS}type")]
XML_TYPES = {t.get("name", ""): t for t in XML_TYPE_LIST}
DESCRIBED_XML = [t for t in XML_TYPES.values() if t.find(f"{NS}descriptor") is not None]


def resolve(type_name: str) -> str:
    """A field's type as a primitive name, or "*" for any value or a composite, following restrictions."""
    while type_name != "*":
        t = XML_TYPES[type_name]
        if t.get("class") == "primitive":
            return type_name
        if t.get("class") == "composite":
            return "*"
        type_name = t.get("source", "*")
    return "*"


def test_xml_reading_finds_the_described_types() -> None:
    # guards the parse below: 96 types, 40 of them described (performatives, sections, outcomes, ...)
    assert len(XML_TYPE_LIST) == len(XML_TYPES) == 96
    assert len(DESCRIBED_XML) == 40


def test_every_described_type_has_exactly_one_class() -> None:
    expected = sorted("".join(w.capitalize() for w in t.get("name", "").split("-")) for t in DESCRIBED_XML)
    assert sorted(cls.__name__ for cls in ALL_TYPES) == expected


@pytest.mark.parametrize("xml", DESCRIBED_XML, ids=[t.get("name", "") for t in DESCRIBED_XML])
def test_class_matches_the_xml(xml: ET.Element) -> None:
    cls = getattr(definitions, "".join(w.capitalize() for w in xml.get("name", "").split("-")))
    descriptor = xml.find(f"{NS}descriptor")
    assert descriptor is not None
    domain, code = (int(part, 16) for part in descriptor.get("code", "").split(":"))
    assert descriptor.get("name") == cls.DESCRIPTOR_NAME
    assert domain << 32 | code == cls.DESCRIPTOR_CODE
    if xml.get("class") == "composite":
        assert issubclass(cls, Composite)
        fields = xml.findall(f"{NS}field")
        assert [f.amqp_name for f in cls.FIELDS] == [f.get("name") for f in fields]
        for spec, field in zip(cls.FIELDS, fields, strict=True):
            assert spec.name == field.get("name", "").replace("-", "_")
            assert spec.mandatory == (field.get("mandatory") == "true"), spec.amqp_name
            assert spec.multiple == (field.get("multiple") == "true"), spec.amqp_name
            assert spec.default == field.get("default"), spec.amqp_name
            wire = resolve(field.get("type", "*"))
            assert spec.type == wire or (spec.type, wire) == ("fields", "map"), spec.amqp_name
    else:
        assert xml.get("class") == "restricted"
        assert issubclass(cls, DescribedSection)
        source = resolve(xml.get("source", "*"))
        assert source == cls.SOURCE or (cls.SOURCE, source) == ("fields", "map")


# -- (c) spec/ is the specification, verbatim -------------------------------------------------------
SPEC_DIGESTS = {
    "index.bare.xml": "add8248e721de2f0e1861e3622fbe9ece8d98b7363aaa25c924af61605a4275c",
    "messaging.bare.xml": "96217d6f3f8c279c8a281fd9ea132f35ff931dcf1030ddccdc785714aec4d3c9",
    "security.bare.xml": "dc3fe69461a67f8b480c76257c65f160b33e5a71475dd96ff6282912eecde219",
    "transactions.bare.xml": "f7a5b76a5ced60666ce99f3574af2140c431c97983906d1138522f735bfddc57",
    "transport.bare.xml": "5c90c1c4f405eb6292f318208667b26bd86c3d9f69978927626a750ffe3ff912",
    "types.bare.xml": "05f723c2e58b26a98e459f93f07f04a151a43a426cca06a6f49cc51ae7b5429a",
}
"""SHA-256 of each file of the AMQP 1.0 specification's XML (the ``.bare.xml`` set), as copied into ``spec/``."""


def test_spec_is_the_specification_verbatim() -> None:
    """``spec/`` (what ``definitions.py`` is generated from) holds exactly the specification's files, unedited."""
    assert sorted(p.name for p in SPEC.iterdir()) == sorted(SPEC_DIGESTS)
    for name, digest in SPEC_DIGESTS.items():
        assert hashlib.sha256((SPEC / name).read_bytes()).hexdigest() == digest, name


# -- (d) encoding and decoding ------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
@settings(deadline=None, max_examples=10)
@given(data=st.data())
def test_composite_round_trip(cls: type[Any], data: st.DataObject) -> None:
    value = data.draw(composite(cls))
    encoded = encode(value)
    assert encoded.startswith(b"\x00" + encode(ULong(cls.DESCRIPTOR_CODE)))
    decoded, end = decode(encoded)
    assert end == len(encoded)
    assert_same(decoded, value)
    # §1.2: a descriptor may be the symbolic name just as well as the numeric code
    symbolic = b"\x00" + encode(Symbol(cls.DESCRIPTOR_NAME)) + encoded[len(cls._DESCRIPTOR) :]
    assert_same(decode(symbolic)[0], value)


@pytest.mark.parametrize("cls", COMPOSITES, ids=class_id)
@settings(deadline=None, max_examples=5)
@given(data=st.data())
def test_trailing_null_fields_are_trimmed(cls: type[Any], data: st.DataObject) -> None:
    value = data.draw(composite(cls))
    fields = decode(encode(value)[len(cls._DESCRIPTOR) :])[0]
    present = [i for i, spec in enumerate(cls.FIELDS) if getattr(value, spec.name) is not None]
    assert len(fields) == (present[-1] + 1 if present else 0)


@pytest.mark.parametrize(
    ("value", "hex"),
    [
        pytest.param(Close(), "00531845", id="close-all-null"),
        pytest.param(
            Begin(next_outgoing_id=1, incoming_window=2, outgoing_window=3),
            "005311" + "c00804" + "40" + "5201" + "5202" + "5203",
            id="begin-leading-null-kept",
        ),
        pytest.param(
            Transfer(handle=0, settled=True),
            "005314" + "c00605" + "43" + "404040" + "41",
            id="transfer-inner-nulls-kept",
        ),
        pytest.param(
            Attach(name="n", handle=1, role=True, snd_settle_mode=2, max_message_size=0),
            "005312" + "c0100b" + "a1016e" + "5201" + "41" + "5002" + "40" * 6 + "44",
            id="attach-plain-ints-take-the-declared-types",
        ),
        pytest.param(
            Open(container_id="c", offered_capabilities=[Symbol("a")], properties={"k": None}),
            "005310" + "c0180a" + "a10163" + "40" * 6 + "e00401a30161" + "40" + "c10502a3016b40",
            id="open-multiple-is-array-fields-keys-are-symbols",
        ),
        pytest.param(Data(b"\x01"), "005375" + "a00101", id="data-section"),
    ],
)
def test_exact_composite_bytes(value: Any, hex: str) -> None:
    assert encode(value).hex() == hex


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(Attach(name="n", handle=0, role=True, snd_settle_mode=256), id="ubyte-out-of-range"),
        pytest.param(Begin(next_outgoing_id=-1, incoming_window=0, outgoing_window=0), id="uint-negative"),
        pytest.param(Open(container_id=5), id="string-field-int"),
        pytest.param(Open(container_id="c", max_frame_size="big"), id="uint-field-str"),
        pytest.param(Open(container_id="c", offered_capabilities=["\u00e9"]), id="symbol-not-ascii"),
        pytest.param(Open(container_id="c", idle_time_out=2**32), id="uint-too-large"),
    ],
)
def test_unencodable_field_values_raise_encode_error(value: Any) -> None:
    with pytest.raises(EncodeError):
        encode(value)


# One value of every AMQP type, to put in fields of every other type.
SAMPLES: dict[str, Any] = {
    "boolean": True,
    "ubyte": UByte(1),
    "ushort": UShort(1),
    "uint": UInt(1),
    "ulong": ULong(1),
    "byte": Byte(1),
    "short": Short(1),
    "int": Int(1),
    "long": Long(1),
    "float": Float(1.0),
    "double": 1.0,
    "decimal32": Decimal32(bytes(4)),
    "decimal64": Decimal64(bytes(8)),
    "decimal128": Decimal128(bytes(16)),
    "char": Char("c"),
    "timestamp": Timestamp(1),
    "uuid": uuid.UUID(int=1),
    "binary": b"b",
    "string": "s",
    "symbol": Symbol("s"),
    "list": [Long(1)],
    "map": {"k": Long(1)},  # string keys: a fields map takes them too, as symbols (clients send that)
    "map-long-keys": {Long(1): Long(1)},
    "map-non-ascii-keys": {"\u00e9": Long(1)},  # a string no symbol can hold
    "fields": {Symbol("k"): Long(1)},  # §2.8.13: a map with symbol keys
    "annotations": {ULong(1): Long(1), Symbol("k"): Long(2)},  # §3.2.10: symbol or ulong keys
    "array-of-symbol": Array("symbol", [Symbol("s")]),
    "array-of-string": Array("string", ["s"]),
    "described": Described(Symbol("x:y"), None),
}


def accepts(spec: FieldSpec, sample: str) -> bool:
    """Whether a field of ``spec``'s type accepts ``SAMPLES[sample]``."""
    if spec.type == "*":
        return True
    if spec.multiple and sample == f"array-of-{spec.type}":
        return True
    maps = {
        "map": {"map", "map-long-keys", "map-non-ascii-keys", "fields", "annotations"},
        "fields": {"fields", "annotations", "map"},  # "map": string keys, decoded as symbols (leniency)
    }
    return sample in maps.get(spec.type, {spec.type})


def valid_fields(cls: type[Any]) -> list[Any]:
    """The shortest list of field values ``cls`` accepts: its mandatory fields, typed; nulls elsewhere."""
    values: list[Any] = [SAMPLES.get(spec.type, Long(1)) if spec.mandatory else None for spec in cls.FIELDS]
    while values and values[-1] is None:
        values.pop()
    return values


def encode_described(cls: type[Any], value: Any) -> bytes:
    """``value`` described by ``cls``'s numeric descriptor, each item encoded as its own Python type."""
    return encode(Described(ULong(cls.DESCRIPTOR_CODE), value))


TYPED_FIELDS = [(cls, i, spec) for cls in COMPOSITES for i, spec in enumerate(cls.FIELDS) if spec.type != "*"]
MANDATORY_FIELDS = [(cls, i, spec) for cls in COMPOSITES for i, spec in enumerate(cls.FIELDS) if spec.mandatory]


def field_id(case: tuple[type[Any], int, FieldSpec]) -> str:
    return f"{case[0].__name__}.{case[2].name}"


@pytest.mark.parametrize("case", TYPED_FIELDS, ids=[field_id(c) for c in TYPED_FIELDS])
def test_a_field_of_another_type_is_a_decode_error(case: tuple[type[Any], int, FieldSpec]) -> None:
    cls, index, spec = case
    wrongly_accepted = []
    for sample, value in SAMPLES.items():
        values = valid_fields(cls)
        values += [None] * (index + 1 - len(values))
        values[index] = value
        encoded = encode_described(cls, values)
        if accepts(spec, sample):
            assert type(decode(encoded)[0]) is cls, sample
            continue
        try:
            decode(encoded)
        except DecodeError:
            continue
        wrongly_accepted.append(sample)
    assert wrongly_accepted == [], f"{spec.amqp_name} is {spec.type}"


FIELDS_MAPS = [(cls, i, spec) for cls in COMPOSITES for i, spec in enumerate(cls.FIELDS) if spec.type == "fields"]


@pytest.mark.parametrize("case", FIELDS_MAPS, ids=[field_id(c) for c in FIELDS_MAPS])
def test_a_symbol_keyed_map_with_string_keys_decodes_with_symbol_keys(case: tuple[type[Any], int, FieldSpec]) -> None:
    # rhea, go-amqp and Azure's JavaScript SDK send an error's info (and other fields maps) with string keys
    cls, index, _ = case
    values = valid_fields(cls)
    values += [None] * (index + 1 - len(values))
    values[index] = {"DeadLetterReason": "x", Symbol("kept"): Long(1), ULong(7): "u"}
    decoded = decode(encode_described(cls, values))[0]
    got = getattr(decoded, cls.FIELDS[index].name)
    assert got == {Symbol("DeadLetterReason"): "x", Symbol("kept"): Long(1), ULong(7): "u"}
    assert [type(key) for key in got] == [Symbol, Symbol, ULong]
    assert decode(encode(decoded))[0] == decoded  # and it encodes back with symbol keys
    for refused in ({Long(1): "x"}, {"\u00e9": "x"}, {"ok": 1, b"k": 2}):
        values[index] = refused
        with pytest.raises(DecodeError, match="symbol keys"):
            decode(encode_described(cls, values))


@pytest.mark.parametrize("cls", [c for c in SECTIONS if c.SOURCE == "fields"], ids=class_id)
def test_annotations_with_string_keys_decode_with_symbol_keys(cls: type[Any]) -> None:
    section = decode(encode_described(cls, {"x-opt-delivery-time": Long(5)}))[0]
    assert section.value == {Symbol("x-opt-delivery-time"): Long(5)}
    assert type(next(iter(section.value))) is Symbol
    with pytest.raises(DecodeError, match="symbol keys"):
        decode(encode_described(cls, {Long(1): Long(5)}))


@pytest.mark.parametrize("case", MANDATORY_FIELDS, ids=[field_id(c) for c in MANDATORY_FIELDS])
def test_a_missing_mandatory_field_is_a_decode_error(case: tuple[type[Any], int, FieldSpec]) -> None:
    cls, index, _ = case
    values = valid_fields(cls)
    assert type(decode(encode_described(cls, values))[0]) is cls  # the baseline decodes
    values[index] = None
    with pytest.raises(DecodeError, match="mandatory"):
        decode(encode_described(cls, values))
    with pytest.raises(DecodeError, match="mandatory"):
        decode(encode_described(cls, values[:index]))  # trimmed away entirely


@pytest.mark.parametrize("cls", COMPOSITES, ids=class_id)
def test_a_composite_that_is_not_a_list_is_a_decode_error(cls: type[Any]) -> None:
    with pytest.raises(DecodeError, match="must be a list"):
        decode(encode(Described(ULong(cls.DESCRIPTOR_CODE), {})))


@pytest.mark.parametrize("cls", SECTIONS, ids=class_id)
def test_a_section_of_another_type_is_a_decode_error(cls: type[Any]) -> None:
    spec = FieldSpec("value", "value", cls.SOURCE)
    wrongly_accepted = []
    for sample, value in SAMPLES.items():
        encoded = encode_described(cls, value)
        if accepts(spec, sample):
            assert type(decode(encoded)[0]) is cls, sample
            continue
        try:
            decode(encoded)
        except DecodeError:
            continue
        wrongly_accepted.append(sample)
    assert wrongly_accepted == [], f"{cls.__name__} is {cls.SOURCE}"


def test_composites_nest_through_star_fields() -> None:
    error = definitions.Error(condition=Symbol("amqp:internal-error"), description="boom")
    value = definitions.Detach(handle=UInt(3), closed=True, error=error)
    assert_same(decode(encode(value))[0], value)
    array = Array("list", [definitions.Accepted()], descriptor=ULong(definitions.Accepted.DESCRIPTOR_CODE))
    assert_same(decode(encode(array))[0], array)
    assert codec.DESCRIBED_TYPES[Symbol("amqp:detach:list")] == definitions.Detach.from_described
