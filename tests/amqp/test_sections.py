"""The message-section walker (``minibroker.amqp.sections``, Part 3 §3.2) and its users.

Proves: each section is found and measured whatever the descriptor's form (§1.2: compact or long ulong, or the
symbolic name); the walk covers a message exactly, section by section; it stops before measuring what it was
not asked for; a value that is not described ends a strict walk with ``DecodeError`` while ``section_at`` never
raises; and the broker's ``Message``, the selectors' ``MessageFields`` and the ``MessageView`` read a section
written with a symbolic or long descriptor like a compact one.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.amqp import codec
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
from minibroker.amqp.sections import (
    AMQP_VALUE,
    APPLICATION_PROPERTIES,
    DATA,
    FOOTER,
    HEADER,
    NOT_A_SECTION,
    PROPERTIES,
    Section,
    section_at,
    section_end,
    walk,
)
from minibroker.amqp.types import DecodeError, Described, Symbol, UByte, ULong
from minibroker.broker.message import Message
from minibroker.broker.selector import MessageFields
from minibroker.broker.views import view_message

SECTION_TYPES: list[type[Any]] = [
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
]


def _long_form(section: Any) -> bytes:
    """``section`` with its descriptor as an 8-byte ulong (0x80) rather than the compact smallulong."""
    compact = codec.encode(section)
    assert compact[:2] == b"\x00\x53"
    return b"\x00\x80" + section.DESCRIPTOR_CODE.to_bytes(8, "big") + compact[3:]


def _symbolic(section: Any) -> bytes:
    """``section`` with its descriptor as its symbolic name."""
    compact = codec.encode(section)
    return b"\x00" + codec.encode(Symbol(section.DESCRIPTOR_NAME)) + compact[3:]


def _sample(cls: type[Any]) -> Any:
    samples: dict[type[Any], Any] = {
        Header: Header(durable=True, priority=UByte(7)),
        DeliveryAnnotations: DeliveryAnnotations({Symbol("x-opt-d"): 1}),
        MessageAnnotations: MessageAnnotations({Symbol("x-opt-m"): "m"}),
        Properties: Properties(subject="s", to="q"),
        ApplicationProperties: ApplicationProperties({"k": "v"}),
        Data: Data(b"bytes"),
        AmqpSequence: AmqpSequence([1, "two"]),
        AmqpValue: AmqpValue("value"),
        Footer: Footer({Symbol("x-f"): True}),
    }
    return samples[cls]


@pytest.mark.parametrize("form", [codec.encode, _long_form, _symbolic], ids=["compact", "ulong", "symbolic"])
@pytest.mark.parametrize("cls", SECTION_TYPES, ids=lambda cls: cls.__name__)
def test_each_section_is_found_and_measured_whatever_its_descriptor(cls: type[Any], form: Any) -> None:
    encoded = form(_sample(cls))
    payload = b"\x00\x53\x75\xa0\x01z" + encoded  # behind a data section: offsets are not from 0
    code, value = section_at(payload, 6)
    assert code == cls.DESCRIPTOR_CODE
    assert section_end(payload, value) == len(payload)
    assert list(walk(payload, 6)) == [Section(code, 6, value, len(payload))]
    assert type(codec.decode(payload, 6)[0]) is cls


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"", id="end"),
        pytest.param(b"\x00\x53", id="cut-short"),
        pytest.param(b"\x41\x00\x53\x70", id="not-described"),
        pytest.param(b"\x00\x53\x79\x45", id="next-code-up"),
        pytest.param(b"\x00\x53\x6f\x45", id="next-code-down"),
        pytest.param(codec.encode(Described(Symbol("x-opt:other"), 1)), id="other-symbol"),
        pytest.param(b"\x00\xa3\x09amqp:head", id="symbol-cut-short"),
        pytest.param(b"\x00\xa1\x10amqp:header:list\x45", id="string-descriptor"),
        pytest.param(b"\x00\xc0\x01\x00\x45", id="list-descriptor"),
    ],
)
def test_section_at_says_when_no_section_starts_there(payload: bytes) -> None:
    assert section_at(payload, 0) == (NOT_A_SECTION, 0)


@given(
    st.lists(st.sampled_from(SECTION_TYPES), max_size=9),
    st.lists(st.sampled_from([codec.encode, _long_form, _symbolic]), min_size=9, max_size=9),
)
def test_the_walk_covers_a_message_section_by_section(kinds: list[type[Any]], forms: list[Any]) -> None:
    parts = [form(_sample(cls)) for cls, form in zip(kinds, forms, strict=False)]
    payload = b"".join(parts)
    walked = list(walk(payload))
    assert [s.code for s in walked] == [cls.DESCRIPTOR_CODE for cls in kinds]
    starts = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    assert [(s.start, s.end) for s in walked] == [
        (start, start + len(p)) for start, p in zip(starts, parts, strict=True)
    ]
    assert [type(codec.decode(payload, s.start)[0]) for s in walked] == kinds


def test_the_walk_stops_before_measuring_what_comes_after_last() -> None:
    head = codec.encode(Header(priority=UByte(1))) + codec.encode(ApplicationProperties({"k": "v"}))
    huge_body = b"\x00\x53\x75\xb0\xff\xff\xff\xff"  # a data section claiming 4 GiB
    assert [s.code for s in walk(head + huge_body, last=APPLICATION_PROPERTIES)] == [HEADER, APPLICATION_PROPERTIES]
    with pytest.raises(DecodeError):
        list(walk(head + huge_body))
    # a body of a kind it was not asked for ends the walk too, and so does a described value that is no section
    assert [s.code for s in walk(codec.encode(Data(b"x")), last=PROPERTIES)] == []
    other = codec.encode(Described(Symbol("x-opt:other"), 1))
    assert [s.code for s in walk(codec.encode(Data(b"x")) + other + codec.encode(Footer({})))] == [DATA]


def test_a_value_that_is_not_described_ends_the_walk_with_a_decode_error() -> None:
    payload = codec.encode(Header()) + b"\x41"
    with pytest.raises(DecodeError, match="not a described value"):
        list(walk(payload))
    assert section_at(payload, len(codec.encode(Header()))) == (NOT_A_SECTION, len(codec.encode(Header())))


def test_an_amqp_value_holding_a_described_value_is_measured() -> None:
    payload = codec.encode(AmqpValue(Described(Symbol("x-opt:d"), ULong(5)))) + codec.encode(Footer({}))
    assert [s.code for s in walk(payload)] == [AMQP_VALUE, FOOTER]


@pytest.mark.parametrize("form", [_long_form, _symbolic], ids=["ulong", "symbolic"])
def test_every_reader_takes_a_long_or_symbolic_section_like_a_compact_one(form: Any) -> None:
    header = Header(durable=True, priority=UByte(7))
    properties = Properties(subject="order", to="orders")
    payload = form(header) + form(properties) + form(ApplicationProperties({"k": 1})) + codec.encode(Data(b"x"))
    message = Message(payload)
    assert (message.priority, message.durable, message.to) == (7, True, "orders")
    fields = MessageFields.from_message(payload)
    assert (fields.priority, fields.durable, fields.subject, fields.application_properties) == (
        7,
        True,
        "order",
        {"k": 1},
    )
    view = view_message(payload)
    assert (view.priority, view.subject, view.properties, view.body) == (7, "order", {"k": 1}, b"x")


def test_a_view_leaves_out_only_the_section_that_does_not_decode() -> None:
    bad_properties = b"\x00\x53\x73\xc0\x07\x04\x40\x40\x40\xa3\x01x"  # a subject that is a symbol, not a string
    payload = codec.encode(Header(priority=UByte(2))) + bad_properties + codec.encode(AmqpValue("body"))
    view = view_message(payload)
    assert (view.priority, view.body) == (2, "body")
