"""Exact bytes for every format code of Part 1 §1.6 (spec/types.bare.xml).

Proves: (1) the encoder writes each type with the spec's constructor and the most compact width its
value allows (uint0/smalluint/uint, str8/str32, list0/list8/list32, ...); (2) the decoder reads every
width of every type, including the ones we never write (0x56 booleans, a uint as 0x70 0, a short list
as list32, ...); (3) every format code the specification lists appears in these tables; (4) malformed
bytes raise ``DecodeError`` and unencodable values ``EncodeError``.
"""

from __future__ import annotations

import enum
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp.codec import decode, decode_all, encode
from minibroker.amqp.definitions import Accepted, Close, Open
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

SPEC = Path(__file__).resolve().parents[2] / "spec"


class Case(NamedTuple):
    id: str
    value: Any
    hex: str


def h(text: str) -> bytes:
    return bytes.fromhex(text)


X255, X256 = "78" * 255, "78" * 256  # 255 and 256 bytes of b"x"

# Canonical encodings: encode(value) is exactly these bytes, and they decode back to value.
CANONICAL = [
    Case("null", None, "40"),
    Case("boolean-true", True, "41"),
    Case("boolean-false", False, "42"),
    Case("ubyte-0", UByte(0), "5000"),
    Case("ubyte-max", UByte(255), "50ff"),
    Case("ushort-0", UShort(0), "600000"),
    Case("ushort-max", UShort(0xFFFF), "60ffff"),
    Case("uint0", UInt(0), "43"),
    Case("smalluint-1", UInt(1), "5201"),
    Case("smalluint-255", UInt(255), "52ff"),
    Case("uint-256", UInt(256), "7000000100"),
    Case("uint-max", UInt(0xFFFFFFFF), "70ffffffff"),
    Case("ulong0", ULong(0), "44"),
    Case("smallulong-1", ULong(1), "5301"),
    Case("smallulong-255", ULong(255), "53ff"),
    Case("ulong-256", ULong(256), "800000000000000100"),
    Case("ulong-max", ULong(2**64 - 1), "80ffffffffffffffff"),
    Case("byte-min", Byte(-128), "5180"),
    Case("byte-max", Byte(127), "517f"),
    Case("byte-minus-1", Byte(-1), "51ff"),
    Case("short-min", Short(-0x8000), "618000"),
    Case("short-max", Short(0x7FFF), "617fff"),
    Case("smallint-0", Int(0), "5400"),
    Case("smallint-min", Int(-128), "5480"),
    Case("smallint-max", Int(127), "547f"),
    Case("int-128", Int(128), "7100000080"),
    Case("int-minus-129", Int(-129), "71ffffff7f"),
    Case("int-min", Int(-(2**31)), "7180000000"),
    Case("int-max", Int(2**31 - 1), "717fffffff"),
    Case("smalllong-0", Long(0), "5500"),
    Case("smalllong-minus-1", Long(-1), "55ff"),
    Case("smalllong-max", Long(127), "557f"),
    Case("long-128", Long(128), "810000000000000080"),
    Case("long-minus-129", Long(-129), "81ffffffffffffff7f"),
    Case("long-min", Long(-(2**63)), "818000000000000000"),
    Case("long-max", Long(2**63 - 1), "817fffffffffffffff"),
    Case("float-1.5", Float(1.5), "723fc00000"),
    Case("float-minus-0", Float(-0.0), "7280000000"),
    Case("float-inf", Float(float("inf")), "727f800000"),
    Case("float-nan", Float(float("nan")), "727fc00000"),
    Case("double-1.5", 1.5, "823ff8000000000000"),
    Case("double-minus-inf", float("-inf"), "82fff0000000000000"),
    Case("double-nan", float("nan"), "827ff8000000000000"),
    Case("decimal32", Decimal32(h("22500001")), "7422500001"),
    Case("decimal64", Decimal64(h("2238000000000001")), "842238000000000001"),
    Case("decimal128", Decimal128(h("22080000000000000000000000000001")), "9422080000000000000000000000000001"),
    Case("char-ascii", Char("a"), "7300000061"),
    Case("char-astral", Char("\U0001f600"), "730001f600"),
    Case("timestamp", Timestamp(1311704463521), "830000013167adb8a1"),
    Case("timestamp-before-epoch", Timestamp(-1), "83ffffffffffffffff"),
    Case("uuid", uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"), "9800112233445566778899aabbccddeeff"),
    Case("vbin8-empty", b"", "a000"),
    Case("vbin8", b"\x00\xff", "a00200ff"),
    Case("vbin8-255", b"x" * 255, "a0ff" + X255),
    Case("vbin32-256", b"x" * 256, "b000000100" + X256),
    Case("str8-empty", "", "a100"),
    Case("str8-utf8", "h\u00e9", "a10368c3a9"),
    Case("str8-255", "x" * 255, "a1ff" + X255),
    Case("str32-256", "x" * 256, "b100000100" + X256),
    Case("sym8-empty", Symbol(""), "a300"),
    Case("sym8", Symbol("amqp"), "a304616d7170"),
    Case("sym8-255", Symbol("x" * 255), "a3ff" + X255),
    Case("sym32-256", Symbol("x" * 256), "b300000100" + X256),
    Case("list0", [], "45"),
    Case("list8", [None, True, UInt(0)], "c00403404143"),
    Case("list8-nested", [[], [Long(1)]], "c00702" + "45" + "c0030155" + "01"),
    # list8's size octet counts the count octet too: 254 bytes of elements is the most it holds
    Case("list8-largest", [b"x" * 252], "c0ff01a0fc" + "78" * 252),
    Case("list32-smallest", [b"x" * 253], "d00000010300000001a0fd" + "78" * 253),
    Case("list32-many", [None] * 256, "d000000104" + "00000100" + "40" * 256),
    Case("map8-empty", {}, "c10100"),
    Case("map8", {Symbol("a"): None, "b": UInt(1)}, "c10a04" + "a30161" + "40" + "a10162" + "5201"),
    Case("map32", {Symbol("k"): b"x" * 256}, "d10000010c00000002" + "a3016b" + "b000000100" + X256),
    Case("array8-empty", Array("uint", []), "e00200" + "70"),
    Case("array8-uint", Array("uint", [UInt(1), UInt(2)]), "e00a0270" + "00000001" + "00000002"),
    Case("array8-boolean", Array("boolean", [True, False]), "e0040256" + "0100"),
    Case("array8-symbol", Array("symbol", [Symbol("a"), Symbol("bc")]), "e00702a3" + "0161" + "026263"),
    Case("array8-null", Array("null", [None, None]), "e0020240"),
    Case("array32-null", Array("null", [None] * 3), "f0000000050000000340"),
    Case("array32-symbol", Array("symbol", [Symbol("x" * 256)]), "f00000010900000001b3" + "00000100" + X256),
    Case("array8-of-arrays", Array("array", [Array("ubyte", [UByte(1)])]), "e00c01f0" + "00000006000000015001"),
    Case("array8-of-lists", Array("list", [[Long(1)]]), "e00c01d0" + "00000006000000015501"),
    Case("array8-of-maps", Array("map", [{}]), "e00a01d1" + "0000000400000000"),
    Case(
        "array8-described",
        Array("symbol", [Symbol("a")], descriptor=Symbol("d")),
        "e00801" + "00a30164" + "a3" + "0161",
    ),
    Case(
        "array8-described-composites",
        Array("list", [Accepted(), Accepted()], descriptor=ULong(0x24)),
        "e01502" + "005324" + "d0" + "0000000400000000" * 2,
    ),
    Case("described-symbol", Described(Symbol("x"), Long(1)), "00a301785501"),
    Case("described-ulong", Described(ULong(0x100), None), "0080000000000000010040"),
    Case("described-composite-empty", Close(), "00531845"),
    Case("described-composite", Open(container_id="c"), "005310c00401a10163"),
]  # fmt: skip

# Other widths (and forms) a peer may send: the decoder reads them; the encoder never writes them.
DECODE_ONLY = [
    Case("boolean-0x56-true", True, "5601"),
    Case("boolean-0x56-false", False, "5600"),
    Case("uint-as-smalluint-0", UInt(0), "5200"),
    Case("uint-as-uint-0", UInt(0), "7000000000"),
    Case("uint-as-uint-1", UInt(1), "7000000001"),
    Case("ulong-as-smallulong-0", ULong(0), "5300"),
    Case("ulong-as-ulong-1", ULong(1), "800000000000000001"),
    Case("int-as-int-1", Int(1), "7100000001"),
    Case("long-as-long-minus-1", Long(-1), "81ffffffffffffffff"),
    Case("vbin32-short", b"ab", "b0000000026162"),
    Case("str32-short", "ab", "b1000000026162"),
    Case("sym32-short", Symbol("ab"), "b3000000026162"),
    Case("list8-empty", [], "c00100"),
    Case("list32-empty", [], "d00000000400000000"),
    Case("list32-short", [None], "d0000000050000000140"),
    Case("map32-empty", {}, "d10000000400000000"),
    Case("map32-short", {Symbol("a"): True}, "d10000000800000002" + "a3016141"),
    Case("array32-short", Array("ubyte", [UByte(7)]), "f000000006000000015007"),
    Case("array8-smalluint", Array("uint", [UInt(1), UInt(2)]), "e004025201" + "02"),
    Case("array8-uint0", Array("uint", [UInt(0), UInt(0)]), "e0020243"),
    Case("array8-true", Array("boolean", [True, True]), "e0020241"),
    Case("array8-list0", Array("list", [[], []]), "e0020245"),
    Case("array8-str8", Array("string", ["a"]), "e00401a10161"),
    Case("array32-str32", Array("string", ["a"]), "f00000000a00000001b10000000161"),
    Case("described-symbol-descriptor", Close(), "00a30f616d71703a636c6f73653a6c69737445"),
    Case("described-ulong-descriptor-as-ulong", Close(), "0080000000000000001845"),
    Case("described-list8-empty", Close(), "005318c00100"),
]  # fmt: skip


def case_ids(cases: list[Case]) -> list[str]:
    return [case.id for case in cases]


@pytest.mark.parametrize("case", CANONICAL, ids=case_ids(CANONICAL))
def test_encode_exact_bytes(case: Case) -> None:
    assert encode(case.value).hex() == case.hex


@pytest.mark.parametrize("case", CANONICAL + DECODE_ONLY, ids=case_ids(CANONICAL + DECODE_ONLY))
def test_decode_every_width(case: Case) -> None:
    data = h(case.hex)
    value, end = decode(data + b"\x40")  # a following value must be left alone
    assert end == len(data)
    assert_same(value, case.value)


def test_every_format_code_of_the_spec_is_covered() -> None:
    root = ET.parse(SPEC / "types.bare.xml").getroot()
    codes = {int(e.get("code", ""), 16) for e in root.iter("{http://www.amqp.org/schema/amqp.xsd}encoding")}
    assert len(codes) == 39  # guards the XML parse itself
    covered = {h(case.hex)[0] for case in CANONICAL + DECODE_ONLY}
    assert codes - covered == set()


def test_decode_starts_at_pos_and_decode_all_reads_a_sequence() -> None:
    data = h("40" + "5201" + "a10161")
    assert decode(data, 1) == (UInt(1), 3)
    assert decode_all(data) == [None, UInt(1), "a"]
    assert decode_all(b"") == []


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decode_reads_any_bytes_like_object(wrap: type[Any]) -> None:
    data = h("c0 20 05  a10161  a30162  a00163  74 01020304  98 00112233445566778899aabbccddeeff")
    expected = ["a", Symbol("b"), b"c", Decimal32(h("01020304")), uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")]
    assert_same(decode(wrap(data)), (expected, len(data)))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(5, Long(5), id="int-is-long"),
        pytest.param(-300, Long(-300), id="negative-int-is-long"),
        pytest.param(2**63, ULong(2**63), id="int-above-long-is-ulong"),
        pytest.param((UInt(1), None), [UInt(1), None], id="tuple-is-list"),
        pytest.param(bytearray(b"ab"), b"ab", id="bytearray-is-binary"),
        pytest.param(memoryview(b"ab"), b"ab", id="memoryview-is-binary"),
    ],
)
def test_natural_python_types(value: Any, expected: Any) -> None:
    assert_same(decode(encode(value))[0], expected)


class Priority(enum.IntEnum):
    HIGH = 9


class Colour(enum.StrEnum):
    RED = "red"


class Millis(Timestamp):
    pass


class Name(Symbol):
    pass


@pytest.mark.parametrize(
    ("value", "hex"),
    [
        pytest.param(Priority.HIGH, "5509", id="IntEnum-is-long"),
        pytest.param(Colour.RED, "a103726564", id="StrEnum-is-string"),
        pytest.param(Millis(1), "830000000000000001", id="Timestamp-subclass-is-timestamp"),
        pytest.param(Name("n"), "a3016e", id="Symbol-subclass-is-symbol"),
    ],
)
def test_subclasses_encode_as_their_nearest_amqp_type(value: Any, hex: str) -> None:
    assert encode(value).hex() == hex


@settings(max_examples=50)
@given(st.integers(0, 2**32 - 1))
def test_uint_width_is_the_most_compact(n: int) -> None:
    assert len(encode(UInt(n))) == (1 if n == 0 else 2 if n < 256 else 5)
    assert len(encode(ULong(n))) == (1 if n == 0 else 2 if n < 256 else 9)


@settings(max_examples=50)
@given(st.integers(-(2**63), 2**63 - 1))
def test_signed_width_is_the_most_compact(n: int) -> None:
    small = -128 <= n <= 127
    assert len(encode(Long(n))) == (2 if small else 9)
    if -(2**31) <= n < 2**31:
        assert len(encode(Int(n))) == (2 if small else 5)


@settings(max_examples=50)
@given(st.binary(max_size=300) | st.text(max_size=150))
def test_variable_width_is_the_most_compact(value: bytes | str) -> None:
    n = len(value.encode() if isinstance(value, str) else value)
    assert len(encode(value)) == (2 if n < 256 else 5) + n


BAD_BYTES = [
    pytest.param("", id="empty"),
    pytest.param("01", id="unknown-format-code"),
    pytest.param("5602", id="boolean-octet-not-0-or-1"),
    pytest.param("70000001", id="truncated-uint"),
    pytest.param("98" + "00" * 15, id="truncated-uuid"),
    pytest.param("a005abcd", id="vbin8-past-end"),
    pytest.param("a101ff", id="string-not-utf8"),
    pytest.param("a30180", id="symbol-not-ascii"),
    pytest.param("7300110000", id="char-beyond-unicode"),
    pytest.param("c00105", id="list-count-beyond-size"),
    pytest.param("c0030240", id="list-size-past-end"),
    pytest.param("c0000000", id="list8-size-below-its-count-octet"),
    pytest.param("c00301" + "4040", id="list-size-disagrees-with-elements"),
    pytest.param("c1030140" + "40", id="map-odd-count"),
    pytest.param("c1030245" + "40", id="map-key-unhashable"),
    pytest.param("e00301" + "ff" + "00", id="array-unknown-element-code"),
    pytest.param("e00401" + "0040" + "00", id="array-element-described-twice"),
    pytest.param("004540", id="descriptor-unhashable"),
    pytest.param("00", id="described-without-descriptor"),
    pytest.param("0040", id="described-without-value"),
]


@pytest.mark.parametrize("hex", BAD_BYTES)
def test_malformed_bytes_raise_decode_error(hex: str) -> None:
    with pytest.raises(DecodeError):
        decode(h(hex))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: UByte(256), id="ubyte-range"),
        pytest.param(lambda: UInt(-1), id="uint-negative"),
        pytest.param(lambda: Byte(128), id="byte-range"),
        pytest.param(lambda: Char("ab"), id="char-two-code-points"),
        pytest.param(lambda: Decimal32(b"abc"), id="decimal32-width"),
        pytest.param(lambda: encode(2**64), id="int-beyond-ulong"),
        pytest.param(lambda: encode(-(2**63) - 1), id="int-below-long"),
        pytest.param(lambda: encode(Symbol("\u00e9")), id="symbol-not-ascii"),
        pytest.param(lambda: encode("\ud800"), id="string-lone-surrogate"),
        pytest.param(lambda: encode(Float(1e300)), id="float-beyond-binary32"),
        pytest.param(lambda: encode(object()), id="unknown-python-type"),
        pytest.param(lambda: encode(Array("no-such-type", [])), id="array-unknown-type"),
        pytest.param(lambda: encode(Array("uint", ["x"])), id="array-item-wrong-type"),
        pytest.param(lambda: encode(Array("ubyte", [256])), id="array-item-out-of-range"),
        pytest.param(lambda: encode(Array("symbol", [Symbol("\u00e9")])), id="array-symbol-not-ascii"),
        pytest.param(lambda: encode(Array("string", ["\ud800"])), id="array-string-lone-surrogate"),
        pytest.param(
            lambda: encode(Array("list", [Described(Symbol("d"), [])], Symbol("d"))), id="array-item-not-list"
        ),
        pytest.param(lambda: encode(Array("null", [None] * 6)), id="array-more-nulls-than-bytes"),
    ],
)  # fmt: skip
def test_unencodable_values_raise_encode_error(make: Any) -> None:
    with pytest.raises(EncodeError):
        make()
