"""The 0-9-1 codec against bytes written by hand from the specification, and against itself.

Known vectors (§4.2.3 frames, §4.2.4 methods, §4.2.5 fields with bits packed low-order first, §4.2.6.1
content headers, RabbitMQ's field-value types) check the codec against something other than its own
encoder; hypothesis round trips cover every generated method and the content properties; bad input
raises ``ProtocolError`` with the reply code the module's docstring promises, bad values ``EncodeError``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.codec import MAX_DEPTH, decode_content_header, decode_method, decode_table, encode_table
from minibroker.amqp091.errors import EncodeError, ProtocolError
from minibroker.amqp091.frames import FrameReader, HeaderFrame, MethodFrame, encode_frame, encode_method_frame
from minibroker.amqp091.values import Byte, Float, Int, Short, Timestamp, UByte, UInt, UShort
from tests.amqp091.strategies import assert_same, method, properties, tables

METHOD_CLASSES = list(d.METHODS.values())


def frame_hex(frame_type: str, channel: str, payload: str) -> str:
    return frame_type + channel + f"{len(bytes.fromhex(payload)):08x}" + payload + "ce"


# -- known bytes -----------------------------------------------------------------------------------------------
VECTORS = [
    pytest.param(
        0,
        d.ConnectionStartOk(
            client_properties={"product": "x"}, mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"
        ),
        "000a000b"  # class 10 connection, method 11 start-ok
        + "0000000e" + "07" + "70726f64756374" + "53" + "00000001" + "78"  # table {product: S "x"}
        + "05" + "504c41494e"  # shortstr PLAIN
        + "0000000c" + "00" + "6775657374" + "00" + "6775657374"  # longstr \0guest\0guest
        + "05" + "656e5f5553",  # shortstr en_US
        id="connection.start-ok",
    ),
    pytest.param(
        1,
        d.BasicPublish(exchange="ex", routing_key="rk", mandatory=True),
        "003c0028" + "0000" + "02" + "6578" + "02" + "726b" + "01",  # reserved short, 2 shortstrs, bits: mandatory
        id="basic.publish-mandatory",
    ),
    pytest.param(
        1, d.BasicAck(delivery_tag=5, multiple=True), "003c0050" + "0000000000000005" + "01", id="basic.ack-multiple"
    ),
    pytest.param(
        2,
        d.BasicNack(delivery_tag=2**64 - 1, multiple=False, requeue=True),
        "003c0078" + "ffffffffffffffff" + "02",  # bits: multiple=0, requeue=1
        id="basic.nack-requeue",
    ),
    pytest.param(1, d.ConfirmSelect(), "0055000a" + "00", id="confirm.select"),
    pytest.param(1, d.ConfirmSelect(nowait=True), "0055000a" + "01", id="confirm.select-nowait"),
    pytest.param(1, d.TxCommit(), "005a0014", id="tx.commit"),
    pytest.param(
        1,
        d.QueueDeclare(queue="q", durable=True, auto_delete=True, no_wait=True, arguments={"x-max-length": 10}),
        "0032000a" + "0000" + "0171" + "1a"  # bits passive=0 durable=1 exclusive=0 auto-delete=1 no-wait=1
        + "00000016" + "0c" + "782d6d61782d6c656e677468" + "6c" + "000000000000000a",
        id="queue.declare-bits-and-arguments",
    ),
    pytest.param(
        0,
        d.ConnectionTune(channel_max=2047, frame_max=131072, heartbeat=60),
        "000a001e" + "07ff" + "00020000" + "003c",
        id="connection.tune",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("channel", "value", "payload"), VECTORS)
def test_method_frames_known_bytes(channel: int, value: Method, payload: str) -> None:
    expected = frame_hex("01", f"{channel:04x}", payload)
    assert encode_method_frame(channel, value).hex() == expected
    frames = FrameReader().feed(bytes.fromhex(expected))
    assert frames == [MethodFrame(channel, value)]


def test_content_header_known_bytes() -> None:
    props = d.BasicProperties(content_type="text/plain", delivery_mode=2, timestamp=1)
    # class 60, weight 0, body size 5, flags: content-type (bit 15), delivery-mode (bit 12), timestamp (bit 6)
    payload = "003c" + "0000" + "0000000000000005" + "9040" + "0a" + b"text/plain".hex() + "02" + "0000000000000001"
    expected = frame_hex("02", "0001", payload)
    assert encode_frame(HeaderFrame(1, 60, 5, props)).hex() == expected
    assert FrameReader().feed(bytes.fromhex(expected)) == [HeaderFrame(1, 60, 5, props)]


def test_content_header_flag_continuation_words_are_read() -> None:
    # a peer may set the continuation bit and send an empty second flag word (§4.2.6.1)
    _, size, props = decode_content_header(
        bytes.fromhex("003c" + "0000" + "0000000000000000" + "8001" + "0000" + "0161")
    )
    assert (size, props) == (0, d.BasicProperties(content_type="a"))


# -- field tables: every RabbitMQ field type -----------------------------------------------------------------
TABLE_VALUES = [
    ("t", True, "01"),
    ("t", False, "00"),
    ("b", Byte(-2), "fe"),
    ("B", UByte(254), "fe"),
    ("s", Short(-2), "fffe"),
    ("u", UShort(65534), "fffe"),
    ("I", Int(-2), "fffffffe"),
    ("i", UInt(2**32 - 2), "fffffffe"),
    ("l", -2, "fffffffffffffffe"),  # a plain int is written as l
    ("f", Float(1.5), "3fc00000"),
    ("d", 1.5, "3ff8000000000000"),
    ("D", Decimal("1.50"), "02" + "00000096"),  # scale 2, unscaled 150
    ("S", "h\u00e9", "00000003" + "68c3a9"),
    ("x", b"\x00\xff", "00000002" + "00ff"),
    ("T", Timestamp(1_700_000_000), "000000006553f100"),
    ("F", {"a": None}, "00000003" + "0161" + "56"),
    ("A", [True, Byte(1)], "00000004" + "7401" + "6201"),
    ("V", None, ""),
]


@pytest.mark.parametrize(("tag", "value", "hex"), TABLE_VALUES, ids=[f"{t}-{v!r}" for t, v, _ in TABLE_VALUES])
def test_field_table_with_every_rabbitmq_type(tag: str, value: Any, hex: str) -> None:
    item = "016b" + tag.encode().hex() + hex  # key "k"
    encoded = f"{len(bytes.fromhex(item)):08x}" + item
    assert encode_table({"k": value}).hex() == encoded
    decoded = decode_table(bytes.fromhex(encoded))
    assert_same(decoded, {"k": value})


def test_table_with_all_types_at_once_round_trips() -> None:
    table = {f"k{i}": value for i, (_, value, _) in enumerate(TABLE_VALUES)}
    assert_same(decode_table(encode_table(table)), table)


@pytest.mark.parametrize(
    ("tag", "hex", "expected"),
    [
        pytest.param("L", "fffffffffffffffe", -2, id="L-read-as-signed-64"),
        pytest.param("t", "07", True, id="t-any-nonzero-is-true"),
        pytest.param("S", "00000001ff", "\udcff", id="S-not-utf8-survives"),
    ],
)
def test_field_values_read_leniently_as_rabbitmq_does(tag: str, hex: str, expected: Any) -> None:
    item = "016b" + tag.encode().hex() + hex
    table = decode_table(bytes.fromhex(f"{len(bytes.fromhex(item)):08x}" + item))
    assert_same(table, {"k": expected})
    if tag == "S":
        assert encode_table(table).hex().endswith("ff")  # the peer's byte goes back out unchanged


# -- round trips ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", METHOD_CLASSES, ids=lambda c: c.NAME)
@settings(deadline=None, max_examples=15)
@given(data=st.data())
def test_every_method_round_trips(cls: type[Method], data: st.DataObject) -> None:
    value = data.draw(method(cls))
    channel = data.draw(st.integers(0, 0xFFFF))
    encoded = encode_method_frame(channel, value)
    frames = FrameReader(frame_max=0).feed(encoded)
    assert len(frames) == 1
    assert isinstance(frames[0], MethodFrame)
    assert frames[0].channel == channel
    assert_same(frames[0].method, value)
    assert encode_method_frame(channel, frames[0].method) == encoded


@settings(deadline=None, max_examples=100)
@given(props=properties(d.BasicProperties), size=st.integers(0, 2**64 - 1))
def test_content_properties_round_trip(props: d.BasicProperties, size: int) -> None:
    frames = FrameReader(frame_max=0).feed(encode_frame(HeaderFrame(3, 60, size, props)))
    assert isinstance(frames[0], HeaderFrame)
    assert (frames[0].class_id, frames[0].body_size) == (60, size)
    assert_same(frames[0].properties, props)


@settings(deadline=None, max_examples=200)
@given(tables)
def test_tables_round_trip(table: dict[str, Any]) -> None:
    assert_same(decode_table(encode_table(table)), table)


# -- the peer's faults: reply codes ---------------------------------------------------------------------------
def deep(depth: int) -> bytes:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return encode_table({"k": value})


@pytest.mark.parametrize(
    ("decode", "hex", "code"),
    [
        pytest.param(decode_method, "003c", 501, id="method-ids-truncated"),
        pytest.param(decode_method, "003c0050" + "00000000000005", 501, id="ack-tag-truncated"),
        pytest.param(decode_method, "003c0050" + "0000000000000005", 501, id="ack-bits-missing"),
        pytest.param(decode_method, "005a0014" + "00", 501, id="tx.commit-trailing-octet"),
        pytest.param(decode_method, "000a000b" + "00000010" + "0000", 501, id="table-runs-past-the-frame"),
        pytest.param(
            decode_method, "000a000b" + "00000003" + "016b" + "5a" + "00000000", 502, id="table-unknown-field-type"
        ),
        pytest.param(decode_method, "000a000b" + "00000002" + "056b" + "00000000", 501, id="table-key-truncated"),
        pytest.param(decode_method, "00630001", 503, id="unknown-class"),
        pytest.param(decode_method, "003c0063", 503, id="unknown-method"),
        pytest.param(decode_content_header, "003c" + "0001" + "0000000000000000" + "0000", 502, id="weight-not-zero"),
        pytest.param(
            decode_content_header, "003c" + "0000" + "0000000000000000" + "0002", 502, id="flag-past-last-property"
        ),
        pytest.param(decode_content_header, "003c" + "0000" + "0000000000000000" + "8000", 501, id="property-missing"),
        pytest.param(
            decode_content_header, "003c" + "0000" + "0000000000000000" + "0001", 501, id="continuation-word-missing"
        ),
        pytest.param(
            decode_content_header, "000a" + "0000" + "0000000000000000" + "0000", 505, id="class-without-content"
        ),
        pytest.param(decode_table, deep(MAX_DEPTH + 1).hex(), 502, id="nested-too-deep"),
    ],
)
def test_malformed_input_raises_protocol_error_with_its_reply_code(decode: Any, hex: str, code: int) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode(bytes.fromhex(hex))
    assert caught.value.reply_code == code
    assert caught.value.hard


def test_a_method_error_names_the_method() -> None:
    with pytest.raises(ProtocolError, match=r"basic\.ack") as caught:
        decode_method(bytes.fromhex("003c0050" + "00"))
    assert (caught.value.class_id, caught.value.method_id) == (60, 80)


def test_nesting_up_to_the_limit_is_read() -> None:
    assert decode_table(deep(MAX_DEPTH))["k"] is not None


# -- our own faults: EncodeError -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(d.BasicPublish(routing_key="k" * 256), id="shortstr-256-bytes"),
        pytest.param(d.BasicPublish(routing_key="\u00e9" * 128), id="shortstr-256-utf8-bytes"),
        pytest.param(d.BasicPublish(routing_key="\ud800"), id="shortstr-lone-surrogate"),
        pytest.param(d.BasicPublish(routing_key=b"k"), id="shortstr-bytes"),  # type: ignore[arg-type]
        pytest.param(d.ConnectionStart(version_major=256), id="octet-256"),
        pytest.param(d.ConnectionTune(channel_max=-1), id="short-negative"),
        pytest.param(d.BasicAck(delivery_tag=2**64), id="longlong-too-large"),
        pytest.param(d.BasicAck(multiple=1), id="bit-int"),  # type: ignore[arg-type]
        pytest.param(d.ConnectionStartOk(response="s"), id="longstr-str"),  # type: ignore[arg-type]
        pytest.param(d.QueueDeclare(arguments={"k": object()}), id="table-value-of-no-type"),
        pytest.param(d.QueueDeclare(arguments={"k": 2**63}), id="table-int-too-large"),
        pytest.param(d.QueueDeclare(arguments={"k" * 256: 1}), id="table-key-too-long"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("-1")}), id="decimal-negative"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("NaN")}), id="decimal-nan"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("1E-256")}), id="decimal-scale-256"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("1E+11")}), id="decimal-too-large"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("1E+999999999")}), id="decimal-huge-exponent-at-once"),
        pytest.param(d.QueueDeclare(arguments={"k": Decimal("9" * 5000)}), id="decimal-5000-digits"),
        pytest.param(d.QueueDeclare(arguments=[]), id="table-not-dict"),  # type: ignore[arg-type]
    ],
)
def test_unencodable_values_raise_encode_error(value: Method) -> None:
    with pytest.raises(EncodeError):
        encode_method_frame(1, value)


def test_ranged_values_refuse_out_of_range() -> None:
    with pytest.raises(EncodeError):
        UByte(256)
    with pytest.raises(EncodeError):
        Byte(-129)
    assert repr(UShort(3)) == "UShort(3)"
    assert repr(Float(0.5)) == "Float(0.5)"


def test_decimal_with_positive_exponent_is_written_unscaled() -> None:
    assert encode_table({"k": Decimal("1E+2")}).hex().endswith("44" + "00" + "00000064")
    assert encode_table({"k": Decimal("0E+50")}).hex().endswith("44" + "00" + "00000000")
    assert math.isclose(float(decode_table(encode_table({"k": Decimal("1E+2")}))["k"]), 100)
