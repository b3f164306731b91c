"""An empty header section (list0, which python-qpid-proton writes in every message) is read without the codec
and gives the same ``Message`` as the general path (Part 3 §3.2.1: every header field at its default; issue 19)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    DeliveryAnnotations,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp.types import Symbol, Timestamp
from minibroker.broker import message as message_module
from minibroker.broker.message import Message

EMPTY_LIST0 = b"\x00\x53\x70\x45"
EMPTY_LIST8 = b"\x00\x53\x70\xc0\x01\x00"  # the same header, the long way: the codec decodes it
# (an absolute-expiry-time: the properties list is long enough for ``expiry_properties_at`` to point at it)
REST = codec.encode(Properties(message_id="m-1", to="q", absolute_expiry_time=Timestamp(7))) + codec.encode(
    AmqpValue("body")
)


def _view(message: Message) -> dict[str, Any]:
    content = message.content
    return {
        "header": content.header,
        "count": content.count,
        "priority": content.priority,
        "malformed": content.malformed,
        "oversized": content.oversized,
        "annotations": content.annotations,
        "properties": message.properties(),
    }


@pytest.mark.parametrize("annotations", [False, True])
def test_an_empty_header_reads_as_the_long_form_does(annotations: bool) -> None:
    middle = codec.encode(MessageAnnotations({Symbol("x-a"): 1})) if annotations else b""
    short, long = Message(EMPTY_LIST0 + middle + REST), Message(EMPTY_LIST8 + middle + REST)
    assert _view(short) == _view(long)
    assert short.header == Header()
    assert short.content.expiry_properties_at >= 0
    assert short.content.expiry_properties_at - len(EMPTY_LIST0) == long.content.expiry_properties_at - len(EMPTY_LIST8)
    assert short.absolute_expiry_time() == long.absolute_expiry_time() == 7
    assert short.encoded() == EMPTY_LIST0 + middle + REST


def test_an_empty_header_needs_no_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the codec decoded a section")

    monkeypatch.setattr(message_module.codec, "decode", refuse)
    assert Message(EMPTY_LIST0 + REST).header == Header()


@pytest.mark.parametrize("limit", [1, 3, 4, 5])
def test_the_size_limit_holds_for_an_empty_header_too(limit: int) -> None:
    """``limit`` (the largest header decoded) refuses a 4-octet empty header below 4, as for any header."""
    short = Message(EMPTY_LIST0 + REST, limit=limit)
    assert short.content.oversized == (limit < len(EMPTY_LIST0))
    if limit >= len(EMPTY_LIST0):  # (the properties section is larger than any of these limits: not compared)
        assert (short.header, short.content.count, short.content.malformed) == (Header(), 0, None)


LONG_PROPERTIES = b"\x00\x80" + (0x73).to_bytes(8, "big")  # the properties descriptor as a ulong: read by the codec
SECTIONS = {
    "delivery-annotations": codec.encode(DeliveryAnnotations({Symbol("x-da"): 1})),
    "message-annotations": codec.encode(MessageAnnotations({Symbol("x-opt-delivery-delay"): 5})),
    "properties-empty": b"\x00\x53\x73\x45",
    "properties-short": codec.encode(Properties(message_id="m-2")),
    "properties-expiring": codec.encode(Properties(message_id="m-3", absolute_expiry_time=Timestamp(9))),
    "application-properties": codec.encode(ApplicationProperties({"k": "v"})),
}


def _fields(message: Message, shift: int, properties_shift: int) -> dict[str, Any]:
    """What ``Content`` read of ``message``, its offsets moved back by ``shift`` (and a properties list's by
    ``properties_shift`` more), so that two encodings of one message compare equal."""
    content = message.content
    return {
        **_view(message),
        "malformed": content.malformed is not None,  # (its text gives the header's size)
        "body_offset": content.body_offset - shift if content.body_offset else 0,
        "annotations_start": content.annotations_start - shift if content.annotations_start else 0,
        "annotations_end": content.annotations_end - shift if content.annotations_end else 0,
        "properties_start": content.properties_start - shift if content.properties_start else 0,
        "expiry_properties_at": (
            -1 if content.expiry_properties_at < 0 else content.expiry_properties_at - shift - properties_shift
        ),
        "expiry": message.absolute_expiry_time(),
    }


@settings(max_examples=300, deadline=None)
@given(
    picked=st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True),
    limit=st.one_of(st.none(), st.integers(1, 3), st.integers(100, 200)),
)
def test_proton_s_prefix_reads_as_the_long_forms_do(picked: list[str], limit: int | None) -> None:
    """An empty header (list0) then whatever follows, proton's properties descriptor among it: ``Content`` reads what
    the codec reads of the same message written the long way (the header as list8, the properties' descriptor as a
    ulong), whatever the sections and the size limit (issue 19: the prefix is recognised without section reads).
    Limits from 4 to 99 are left out: there the two encodings' sizes (the header's 4 and 6 octets, a properties
    section's 7 more) may fall on either side of the limit."""
    order = list(SECTIONS)
    chosen = sorted((name for name in picked if not name.startswith("properties")), key=order.index)
    properties = next((name for name in picked if name.startswith("properties")), None)
    before = [SECTIONS[name] for name in chosen if name != "application-properties"]
    after = [SECTIONS[name] for name in chosen if name == "application-properties"] + [codec.encode(AmqpValue("b"))]
    short_properties = long_properties = b""
    if properties is not None:
        short_properties = SECTIONS[properties]
        long_properties = LONG_PROPERTIES + short_properties[3:]
    short = Message(EMPTY_LIST0 + b"".join(before) + short_properties + b"".join(after), limit=limit)
    long = Message(EMPTY_LIST8 + b"".join(before) + long_properties + b"".join(after), limit=limit)
    shift = len(EMPTY_LIST8) - len(EMPTY_LIST0)
    assert _fields(short, 0, 0) == _fields(long, shift, len(LONG_PROPERTIES) - 3)
