"""The 0-9-1 <-> 1.0 message conversion against RabbitMQ 4's mapping (mc_amqpl.erl, the "conversions" page)."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import proton
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp import types as t
from minibroker.amqp.definitions import (
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp091 import values as v
from minibroker.amqp091.codec import MAX_DEPTH, decode_table, encode_content_header_into, encode_table
from minibroker.amqp091.definitions import BasicProperties
from minibroker.gateway091.convert import AMQP10_TYPE, ConversionError, Converted, from_amqp10, to_amqp10
from tests.amqp.strategies import amqp_values, composite
from tests.amqp091.strategies import assert_same, field_values, shortstrs

X = t.Symbol


def sections_of(message: bytes) -> dict[type, Any]:
    """The decoded sections of a 1.0 message by class (each kind once in these tests, data at most once)."""
    return {type(section): section for section in codec.decode_all(message)}


def encode(*parts: Any) -> bytes:
    return b"".join(codec.encode(part) for part in parts)


# -- 0-9-1 -> 1.0: every property of the documentation's table ---------------------------------------


def test_plain_publish_has_header_annotations_and_one_data_section() -> None:
    message = to_amqp10(BasicProperties(), b"body", "amq.direct", "key")
    assert codec.decode_all(message) == [
        Header(durable=False),
        MessageAnnotations({X("x-exchange"): "amq.direct", X("x-routing-key"): "key"}),
        Data(b"body"),
    ]


@pytest.mark.parametrize(
    ("properties", "header"),
    [
        (BasicProperties(delivery_mode=2), Header(durable=True)),
        (BasicProperties(delivery_mode=1), Header(durable=False)),
        (BasicProperties(priority=7), Header(durable=False, priority=t.UByte(7))),
        (BasicProperties(expiration="60000"), Header(durable=False, ttl=t.UInt(60000))),
        (BasicProperties(expiration="0"), Header(durable=False, ttl=t.UInt(0))),
        (BasicProperties(expiration="abc"), Header(durable=False)),  # the gateway's 406 comes first
        (BasicProperties(expiration=str(2**32)), Header(durable=False)),
    ],
)
def test_header_from_delivery_mode_priority_expiration(properties: BasicProperties, header: Header) -> None:
    assert sections_of(to_amqp10(properties, b"", "", "q"))[Header] == header


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        (BasicProperties(message_id="m-1"), Properties(message_id="m-1")),
        (
            BasicProperties(correlation_id="urn:uuid:0F8FAD5B-D9CB-469F-A165-70867728950E"),
            Properties(correlation_id=uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")),
        ),
        (BasicProperties(message_id="urn:uuid:not-a-uuid"), Properties(message_id="urn:uuid:not-a-uuid")),
        (BasicProperties(message_id="\udcff"), Properties(message_id=b"\xff")),  # no UTF-8: binary
        (BasicProperties(user_id="guest"), Properties(user_id=b"guest")),
        (BasicProperties(reply_to="amq.rabbitmq.reply-to"), Properties(reply_to="/queues/amq.rabbitmq.reply-to")),
        (BasicProperties(reply_to="a/b c"), Properties(reply_to="/queues/a%2Fb%20c")),
        (BasicProperties(content_type="text/plain"), Properties(content_type=X("text/plain"))),
        (BasicProperties(content_encoding="gzip"), Properties(content_encoding=X("gzip"))),
        (BasicProperties(content_type="tëxt"), None),  # symbols are ASCII: dropped
        (BasicProperties(timestamp=1_700_000_000), Properties(creation_time=t.Timestamp(1_700_000_000_000))),
        (BasicProperties(timestamp=2**63), None),  # no 1.0 timestamp holds it
        (BasicProperties(app_id="billing"), Properties(group_id="billing")),
        (BasicProperties(reserved="cluster"), None),  # cluster-id has no place
    ],
)
def test_properties_section(properties: BasicProperties, expected: Properties | None) -> None:
    assert sections_of(to_amqp10(properties, b"", "", "q")).get(Properties) == expected


def test_type_is_the_x_basic_type_annotation() -> None:
    annotations = sections_of(to_amqp10(BasicProperties(type="order.created"), b"", "", "q"))[MessageAnnotations]
    assert annotations.value[X("x-basic-type")] == "order.created"


def test_headers_split_into_application_properties_and_annotations() -> None:
    headers = {
        "long": 1,
        "str": "s",
        "nul": "a\x00b",  # a string with NUL goes as binary
        "big": "é" * 3000,  # over 4096 bytes: binary
        "bin": b"\x00\xff",
        "bool": True,
        "void": None,
        "double": 1.5,
        "float": v.Float(0.5),
        "byte": v.Byte(-1),
        "ubyte": v.UByte(255),
        "short": v.Short(-2),
        "ushort": v.UShort(3),
        "int": v.Int(-4),
        "uint": v.UInt(5),
        "ts": v.Timestamp(6),
        "decimal": Decimal("1.5"),  # dropped: RabbitMQ's from_091 has no decimal
        "table": {"a": 1},  # dropped: no maps in application-properties
        "array": [1],  # dropped: no lists in application-properties
        "CC": ["q1", "q2"],  # CC: the x-cc annotation
        "x-table": {"a": [1, {"b": None}], "d": Decimal(1)},
        "x-delay": 5000,
        "x-tëst": 1,  # a symbol is ASCII: dropped
        "x-exchange": "forged",  # replaced by the publish's
    }
    found = sections_of(to_amqp10(BasicProperties(headers=headers), b"", "ex", "rk"))
    assert found[ApplicationProperties].value == {
        "long": t.Long(1),
        "str": "s",
        "nul": b"a\x00b",
        "big": ("é" * 3000).encode(),
        "bin": b"\x00\xff",
        "bool": True,
        "void": None,
        "double": 1.5,
        "float": t.Float(0.5),
        "byte": t.Byte(-1),
        "ubyte": t.UByte(255),
        "short": t.Short(-2),
        "ushort": t.UShort(3),
        "int": t.Int(-4),
        "uint": t.UInt(5),
        "ts": t.Timestamp(6000),
    }
    assert [type(value) for value in found[ApplicationProperties].value.values()][-7:] == [
        t.Float,
        t.Byte,
        t.UByte,
        t.Short,
        t.UShort,
        t.Int,
        t.UInt,
        t.Timestamp,
    ][-7:]
    assert found[MessageAnnotations].value == {
        X("x-cc"): ["q1", "q2"],
        X("x-table"): {X("a"): [t.Long(1), {X("b"): None}]},
        X("x-delay"): t.Long(5000),
        X("x-exchange"): "ex",
        X("x-routing-key"): "rk",
    }


def test_amqp10_typed_body_of_sections_is_those_sections() -> None:
    body = encode(AmqpValue({"k": 1}), Footer({X("f"): 1}))
    message = to_amqp10(BasicProperties(type=AMQP10_TYPE), body, "", "q")
    assert message.endswith(body)
    assert AmqpValue in sections_of(message)
    assert Data not in sections_of(message)


@pytest.mark.parametrize("body", [b"not sections", encode(Header(durable=True)), encode(AmqpValue(1))[:-1]])
def test_amqp10_typed_body_that_is_no_body_sections_is_data(body: bytes) -> None:
    assert sections_of(to_amqp10(BasicProperties(type=AMQP10_TYPE), body, "", "q"))[Data] == Data(body)


# -- 1.0 -> 0-9-1 ------------------------------------------------------------------------------------


def test_message_from_our_codec() -> None:
    message = encode(
        Header(durable=True, priority=t.UByte(9), ttl=t.UInt(1000), delivery_count=t.UInt(2)),
        DeliveryAnnotations({X("x-opt-lock"): 1}),
        MessageAnnotations(
            {
                X("x-exchange"): "amq.topic",
                X("x-routing-key"): "a.b",
                X("x-basic-type"): "kind",
                X("x-cc"): ["q9"],
                X("x-opt-rabbitmq-received-time"): t.Timestamp(1234),
                X("x-death"): "internal",
                X("x-basic-priority"): t.UByte(1),  # the header wins
                X("x-uuid"): uuid.uuid4(),  # no 0-9-1 type: dropped
                X("x-big"): t.ULong(2**64 - 1),  # past a signed 64-bit long: dropped
                X("x-sym"): X("s"),
                t.ULong(5): "not a symbol key",
            }
        ),
        Properties(
            message_id=t.ULong(42),
            user_id=b"guest",
            subject="subj",
            reply_to="/queues/a%2Fb",
            correlation_id=b"\x01\x02",
            content_type=X("application/json"),
            content_encoding=X("utf-8"),
            creation_time=t.Timestamp(1_700_000_000_999),
            group_id="grp",
        ),
        ApplicationProperties({"k": t.UInt(3), "bin": b"\xff", "arr": t.Array("int", [t.Int(1)]), "c": t.Char("c")}),
        Data(b"ab"),
        Data(b"cd"),
        Footer({X("f"): 1}),
    )
    converted = from_amqp10(message)
    assert converted.body == b"abcd"
    assert (converted.exchange, converted.routing_key, converted.delivery_count) == ("amq.topic", "a.b", 2)
    expected = BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={
            "CC": ["q9"],
            "timestamp_in_ms": 1234,
            "x-sym": "s",
            "x-correlation-id": b"\x01\x02",
            "k": v.UInt(3),
            "bin": "\udcff",
            "arr": [v.Int(1)],
        },
        delivery_mode=2,
        priority=9,
        reply_to="a/b",
        expiration="1000",
        message_id="42",
        timestamp=1_700_000_000,
        type="kind",
        user_id="guest",
        app_id="grp",
    )
    assert_same(converted.properties, expected)


@pytest.mark.parametrize(
    ("annotations", "delivery_mode", "priority", "expiration"),
    [
        ({X("x-basic-delivery-mode"): t.UByte(2)}, 2, None, None),
        ({X("x-basic-priority"): t.UByte(4), X("x-basic-expiration"): "50"}, None, 4, "50"),
        ({X("x-basic-priority"): "high"}, None, None, None),  # wrongly typed: absent
    ],
)
def test_without_a_header_the_basic_annotations_count(
    annotations: dict[Any, Any], delivery_mode: int | None, priority: int | None, expiration: str | None
) -> None:
    properties = from_amqp10(encode(MessageAnnotations(annotations), Data(b""))).properties
    assert (properties.delivery_mode, properties.priority, properties.expiration) == (
        delivery_mode,
        priority,
        expiration,
    )


@pytest.mark.parametrize(
    ("value", "message_id", "headers"),
    [
        (uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"), "urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e", None),
        ("m" * 255, "m" * 255, None),
        ("m" * 256, None, {"x-message-id": "m" * 256}),
        (b"\x00", None, {"x-message-id": b"\x00"}),
        (t.Char("c"), None, None),
    ],
)
def test_message_id(value: Any, message_id: str | None, headers: dict[str, Any] | None) -> None:
    properties = from_amqp10(encode(Properties(message_id=value), Data(b""))).properties
    assert (properties.message_id, properties.headers) == (message_id, headers)


@pytest.mark.parametrize(
    ("user_id", "reply_to", "expected"),
    [
        (b"\xff", "/queues/%zz", (None, None)),  # no UTF-8; an escape that does not decode
        (b"a\x00", "/exchanges/x/y", (None, "/exchanges/x/y")),
        (b"u" * 256, "r" * 256, (None, None)),
    ],
)
def test_user_id_and_reply_to_that_do_not_fit(user_id: bytes, reply_to: str, expected: tuple[Any, Any]) -> None:
    properties = from_amqp10(encode(Properties(user_id=user_id, reply_to=reply_to), Data(b""))).properties
    assert (properties.user_id, properties.reply_to) == expected


@pytest.mark.parametrize(
    "body",
    [
        [AmqpValue({"k": [1, 2]})],
        [AmqpSequence([1]), AmqpSequence(["two"])],
        [AmqpValue("v"), Footer({X("f"): 1})],
        [Data(b"a"), AmqpValue(1)],  # not a valid body: passed on as it came
    ],
)
def test_a_body_that_is_not_data_is_its_encoded_sections_typed_amqp10(body: list[Any]) -> None:
    encoded = encode(*body)
    converted = from_amqp10(encode(Header(durable=False), MessageAnnotations({X("x-basic-type"): "t"})) + encoded)
    assert (converted.body, converted.properties.type) == (encoded, AMQP10_TYPE)
    again = to_amqp10(converted.properties, converted.body, "", "q")
    assert again.endswith(encoded)


def test_no_body_is_an_empty_amqp10_body() -> None:
    converted = from_amqp10(encode(Header(durable=True)))
    assert (converted.body, converted.properties.type, converted.properties.delivery_mode) == (b"", AMQP10_TYPE, 2)
    assert from_amqp10(b"").body == b""


def test_without_an_x_routing_key_there_is_no_routing_key_whatever_the_subject() -> None:
    """The consumer gives the queue's name then (``consume._default_routing_key``), as RabbitMQ 4 routes a 1.0 post
    to ``/queues/NAME``; the subject is no routing key (review_i18's probe)."""
    converted = from_amqp10(encode(Properties(subject="s"), AmqpValue(None)))
    assert (converted.exchange, converted.routing_key) == ("", None)


def test_proton_messages() -> None:
    message = proton.Message(
        body="hello",
        id=uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
        correlation_id=proton.ulong(7),
        durable=True,
        priority=3,
        ttl=1.5,
        subject="sub",
        reply_to="/queues/replies",
        content_type="text/plain",
        user_id=b"u",
        creation_time=12.0,
        group_id="g",
        properties={"a": 1, "b": proton.int32(2), "c": proton.ubyte(3), "s": "x"},
        annotations={"x-opt-k": "v", "x-arr": proton.Array(proton.UNDESCRIBED, proton.Data.INT, 1, 2)},
    )
    converted = from_amqp10(message.encode())
    assert converted.properties == BasicProperties(
        content_type="text/plain",
        headers={"x-opt-k": "v", "x-arr": [v.Int(1), v.Int(2)], "a": 1, "b": v.Int(2), "c": v.UByte(3), "s": "x"},
        delivery_mode=2,
        priority=3,
        correlation_id="7",
        reply_to="replies",
        expiration="1500",
        message_id="urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
        timestamp=12,
        type=AMQP10_TYPE,
        user_id="u",
        app_id="g",
    )
    assert converted.routing_key is None  # no x-routing-key: the consumer gives its queue's name
    assert codec.decode_all(converted.body) == [AmqpValue("hello")]
    binary = from_amqp10(proton.Message(body=b"raw", inferred=True).encode())
    assert (binary.body, binary.properties.type, binary.properties.delivery_mode) == (b"raw", None, None)


def test_proton_reads_what_a_091_publisher_sent() -> None:
    message = proton.Message()
    message.decode(
        to_amqp10(
            BasicProperties(content_type="text/plain", delivery_mode=2, message_id="m", headers={"h": "v"}),
            b"payload",
            "amq.fanout",
            "",
        )
    )
    assert (message.body, message.durable, message.id, message.content_type) == (b"payload", True, "m", "text/plain")
    assert message.properties == {"h": "v"}
    assert message.annotations == {"x-exchange": "amq.fanout", "x-routing-key": ""}


# -- round trips 0-9-1 -> 1.0 -> 0-9-1 ----------------------------------------------------------------

_URN = re.compile(r"urn:uuid:[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z")
_INTERNAL = ("x-basic-", "x-exchange", "x-routing-key", "x-death")


def _project_value(value: Any) -> Any:
    """What a header value becomes through 1.0 (``_GONE``: dropped): the module docstring's rules, restated."""
    if isinstance(value, Decimal):
        return _GONE
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, v.Timestamp) and value * 1000 >= 2**63:
        return _GONE
    if isinstance(value, dict):
        table = {key: _project_value(item) for key, item in value.items() if key.isascii()}
        return {key: item for key, item in table.items() if item is not _GONE}
    if isinstance(value, list):
        return [item for item in map(_project_value, value) if item is not _GONE]
    return value


_GONE = object()


def _kept(value: Any) -> bool:
    return _project_value(value) is not _GONE


def _project_headers(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    result: dict[str, Any] = {}
    for key, value in (headers or {}).items():  # x- headers (and CC arrays) travel first, as annotations
        if key.startswith("x-") or (key == "CC" and isinstance(value, list)):
            name = "CC" if key in ("x-cc", "CC") else key
            if key.isascii() and not key.startswith(_INTERNAL) and _kept(value):
                result.setdefault(name, _project_value(value))
    for key, value in (headers or {}).items():
        if key.startswith("x-") or isinstance(value, dict | list) or not _kept(value):
            continue
        result.setdefault(key, _project_value(value))
    return result or None


def _project(p: BasicProperties) -> BasicProperties:
    expiration = p.expiration if p.expiration is not None and p.expiration.isascii() else None
    if expiration is not None:
        expiration = str(int(expiration)) if expiration.isdigit() and int(expiration) < 2**32 else None
    reply_to = p.reply_to
    if reply_to is not None and len("/queues/" + quote(reply_to.encode(), safe="")) > 255:
        reply_to = None

    def ascii_or_none(value: str | None) -> str | None:
        return value if value is not None and value.isascii() else None

    def urn(value: str | None) -> str | None:
        return value.lower() if value is not None and _URN.match(value) else value

    return BasicProperties(
        content_type=ascii_or_none(p.content_type),
        content_encoding=ascii_or_none(p.content_encoding),
        headers=_project_headers(p.headers),
        delivery_mode=2 if p.delivery_mode == 2 else 1,
        priority=p.priority,
        correlation_id=urn(p.correlation_id),
        reply_to=reply_to,
        expiration=expiration,
        message_id=urn(p.message_id),
        timestamp=p.timestamp if p.timestamp is None or p.timestamp * 1000 < 2**63 else None,
        type=p.type,
        user_id=p.user_id if p.user_id is not None and "\x00" not in p.user_id else None,
        app_id=p.app_id,
        reserved=None,
    )


header_names = st.one_of(shortstrs, st.sampled_from(["x-a", "x-cc", "CC", "x-death", "x-basic-type", "x-é"]))
headers = st.dictionaries(header_names, field_values, max_size=6)
ids = shortstrs | st.uuids().map(lambda u: f"urn:uuid:{str(u).upper()}")
basic_properties = st.builds(
    BasicProperties,
    content_type=st.none() | shortstrs,
    content_encoding=st.none() | shortstrs,
    headers=st.none() | headers,
    delivery_mode=st.none() | st.integers(0, 255),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | ids,
    reply_to=st.none() | shortstrs,
    expiration=st.none() | st.integers(0, 2**33).map(str) | shortstrs,
    message_id=st.none() | ids,
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    type=st.none() | shortstrs.filter(lambda s: s != AMQP10_TYPE),
    user_id=st.none() | shortstrs,
    app_id=st.none() | shortstrs,
    reserved=st.none() | shortstrs,
)


@settings(max_examples=150, deadline=None)
@given(basic_properties, st.binary(max_size=50), shortstrs, shortstrs)
def test_round_trip_is_lossless_or_the_documented_projection(
    properties: BasicProperties, body: bytes, exchange: str, routing_key: str
) -> None:
    if properties.headers is not None:  # as a 0-9-1 publisher's headers arrive: through the wire codec
        wire = decode_table(encode_table(properties.headers))
        properties = BasicProperties(**{**_fields(properties), "headers": wire})
    converted = from_amqp10(to_amqp10(properties, body, exchange, routing_key))
    assert converted == Converted(_project(properties), body, exchange, routing_key, 0)
    assert_same(converted.properties.headers, _project(properties).headers)
    # a second trip follows the same rules (not always a fixed point: an x-cc table comes back as a CC table,
    # which the next trip drops as a table under a name without x-)
    again = from_amqp10(to_amqp10(converted.properties, body, exchange, routing_key))
    assert again == Converted(_project(converted.properties), body, exchange, routing_key, 0)


def _fields(p: BasicProperties) -> dict[str, Any]:
    return {name: getattr(p, name) for name, _ in BasicProperties.PROPERTIES}


# -- malformed 1.0 input ----------------------------------------------------------------------------

VALID = encode(
    Header(durable=True), MessageAnnotations({X("x-exchange"): "e"}), Properties(message_id="m"), Data(b"body")
)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x53",  # not described
        b"\x00\x53\x70",  # cut short
        b"\x00\x53\x75\xa0\x05ab",  # data runs past the end
        VALID[:-1],
        VALID + b"\x00\x53\x99\x40",  # a described value that is no section
        encode(Data(b"x")) + b"\x41",  # trailing bytes
        b"\x00\x53\x75\xa1\x01a",  # data holding a string
        b"\x00\x53\x70\xc0\x02\x01\xff",  # a header whose field does not decode
    ],
)
def test_malformed_messages_raise_conversion_error(payload: bytes) -> None:
    with pytest.raises(ConversionError):
        from_amqp10(payload)


def test_wrongly_typed_fields_and_annotations_are_absent() -> None:
    message = codec.encode(t.Described(t.ULong(0x70), ["yes", "high", -1, None, "many"])) + encode(
        MessageAnnotations({X("x-exchange"): 5, X("x-routing-key"): ["k"], X("x-basic-type"): 1}),
        Properties(message_id=X("sym"), correlation_id=t.Char("c"), reply_to=b"r", group_id="g" * 256),
        Data(b"b"),
    )
    assert from_amqp10(message) == Converted(BasicProperties(), b"b", "", None, 0)
    user_id = codec.encode(t.Described(t.ULong(0x73), [None, "user", None, 5])) + encode(Data(b""))
    assert from_amqp10(user_id) == Converted(BasicProperties(), b"", "", None, 0)


@pytest.mark.parametrize(
    "section",
    [
        t.Described(t.ULong(0x70), {"durable": True}),  # a header is a list
        t.Described(t.ULong(0x73), "props"),  # properties are a list
        t.Described(t.ULong(0x72), [1]),  # annotations are a map
        t.Described(t.ULong(0x74), None),  # application-properties are a map
    ],
)
def test_sections_of_the_wrong_shape_raise_conversion_error(section: t.Described) -> None:
    with pytest.raises(ConversionError):
        from_amqp10(codec.encode(section) + encode(Data(b"b")))


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=64)
    | st.builds(lambda cut, extra: VALID[:cut] + extra, st.integers(0, len(VALID)), st.binary(max_size=8))
)
def test_any_bytes_convert_or_raise_conversion_error(payload: bytes) -> None:
    try:
        converted = from_amqp10(payload)
    except ConversionError:
        return
    assert isinstance(converted.body, bytes)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_values_nested_deeper_than_091_tables_allow_are_dropped() -> None:
    message = encode(MessageAnnotations({X("x-ok"): nested(MAX_DEPTH - 1), X("x-deep"): nested(MAX_DEPTH + 5)}))
    headers = from_amqp10(message).properties.headers
    assert headers == {"x-ok": nested(MAX_DEPTH - 1), "x-deep": nested(MAX_DEPTH - 1)}  # the deeper lists cut off
    assert decode_table(encode_table(headers)) == headers  # which 0-9-1 reads back


section_kinds = (
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
)
messages_10 = st.lists(st.sampled_from(section_kinds).flatmap(composite), max_size=7).map(
    lambda parts: b"".join(codec.encode(part) for part in sorted(parts, key=lambda part: part.DESCRIPTOR_CODE))
)
annotated = st.builds(
    lambda annotations, rest: encode(MessageAnnotations(annotations)) + rest,
    st.dictionaries(st.text(max_size=8).map(lambda s: X("x-" + s.encode("ascii", "replace").decode())), amqp_values(6)),
    messages_10,
)


@settings(max_examples=150, deadline=None)
@given(messages_10 | annotated)
def test_any_10_message_converts_to_what_091_can_send(message: bytes) -> None:
    converted = from_amqp10(message)
    out = bytearray()
    encode_content_header_into(out, converted.properties, len(converted.body))  # raises on what 0-9-1 can't hold
    assert len(converted.exchange.encode()) <= 255
    assert converted.routing_key is None or len(converted.routing_key.encode()) <= 255


def test_non_utf8_short_strings_from_a_091_publisher() -> None:
    properties = BasicProperties(message_id="\udcff", type="\udcfe", app_id="\udcfd", user_id="\udcfc")
    converted = from_amqp10(to_amqp10(properties, b"", "", "q"))
    assert converted.properties == BasicProperties(delivery_mode=1, headers={"x-message-id": b"\xff"})


@given(st.sampled_from([None, 1, 2]), shortstrs, shortstrs, st.none() | st.text(max_size=30))
def test_a_plain_publish_encodes_as_the_general_path_does(
    delivery_mode: int | None, exchange: str, routing_key: str, to: str | None
) -> None:
    """A publish with no headers, type or properties but delivery-mode takes the cached path (its sections
    encoded once per exchange, key and address); it gives the bytes the general path gives (empty headers)."""
    general = to_amqp10(BasicProperties(delivery_mode=delivery_mode, headers={}), b"body", exchange, routing_key, to)
    for _ in range(2):  # the first call fills the cache, the second reads it
        assert to_amqp10(BasicProperties(delivery_mode=delivery_mode), b"body", exchange, routing_key, to) == general
