"""``Content.expiry_properties_at``: the place of the properties list when its encoded count reaches
absolute-expiry-time, found while the sections before it are read
(Part 3 §3.2: header, delivery-annotations, message-annotations, properties, in that order), and
``Message.absolute_expiry_time`` read through it (issue 19), for every combination of the sections before it."""

from __future__ import annotations

import itertools

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
from minibroker.amqp.types import Symbol, Timestamp, UByte, UInt
from minibroker.broker.message import Message

BEFORE = {
    "header": Header(priority=UByte(7)),
    "delivery-annotations": DeliveryAnnotations({Symbol("x-da"): "d"}),
    "message-annotations": MessageAnnotations({Symbol("x-ma"): "m"}),
}


@pytest.mark.parametrize(
    "present", [combo for n in range(4) for combo in itertools.combinations(list(BEFORE), n)], ids=str
)
@pytest.mark.parametrize("properties", ["none", "short", "with-expiry"])
def test_absolute_expiry_is_read_after_any_sections(present: tuple[str, ...], properties: str) -> None:
    sections = [BEFORE[name] for name in present]
    if properties == "short":
        sections.append(Properties(message_id="id-1", to="q"))  # trailing fields trimmed: no expiry field
    elif properties == "with-expiry":
        sections.append(Properties(message_id="id-1", absolute_expiry_time=Timestamp(1_700_000_000_123)))
    sections.append(ApplicationProperties({"k": 1}))
    payload = b"".join(codec.encode(section) for section in [*sections, AmqpValue("body")])
    message = Message(payload)
    assert message.malformed is None
    at = message.content.expiry_properties_at
    if properties == "none":
        assert at == -1
        assert message.properties() is None
    elif properties == "short":
        assert at == -1  # too few fields for an absolute-expiry-time: not looked at again on arrival
        assert message.properties() is not None
    else:
        assert payload[at] in (0xC0, 0xD0)  # the properties' list constructor
        assert message.properties() is not None
    assert message.absolute_expiry_time() == (1_700_000_000_123 if properties == "with-expiry" else None)


def test_a_malformed_message_is_looked_at_from_its_first_byte() -> None:
    """Annotations that do not decode: the message is malformed (and refused), its sections read from its first
    byte, where no properties section starts, so it has no absolute expiry (as before issue 19)."""
    broken = b"\x00\x53\x72\xc1\x03\x02\xa1"  # message-annotations: a map whose key runs past the end
    message = Message(broken + codec.encode(Properties(absolute_expiry_time=Timestamp(5))))
    assert message.malformed is not None
    assert message.content.expiry_properties_at == -1
    assert message.absolute_expiry_time() is None


def _properties(values: list[object], constructor: int) -> bytes:
    """A properties section holding ``values`` (its first fields) as list0, list8 or list32 (``constructor``)."""
    head = b"\x00\x53\x73"
    if constructor == 0x45:
        return head + b"\x45"
    items = b"".join(codec.encode(value) for value in values)
    if constructor == 0xC0:
        return head + bytes((0xC0, len(items) + 1, len(values))) + items
    return head + b"\xd0" + (len(items) + 4).to_bytes(4, "big") + len(values).to_bytes(4, "big") + items


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(0, 13),
    constructor=st.sampled_from([0x45, 0xC0, 0xD0]),
    header=st.sampled_from([b"", b"\x00\x53\x70\x45", codec.encode(Header(ttl=UInt(5)))]),
    expiry=st.one_of(st.none(), st.integers(0, 2**40)),
    cut=st.integers(0, 12),
)
def test_absolute_expiry_is_what_the_decoded_properties_say(
    count: int, constructor: int, header: bytes, expiry: int | None, cut: int
) -> None:
    """Whatever the properties' encoding (python-qpid-proton's empty list0, list8, list32), field count, and however
    the message is cut short, ``absolute_expiry_time`` is what decoding the properties gives (issue 19: the count is
    read once on arrival, and a list too short for the field is never decoded)."""
    values: list[object] = [None] * count
    if count >= 9:
        values[8] = None if expiry is None else Timestamp(expiry)
    section = _properties(values, 0x45 if count == 0 else constructor)
    payload = header + section + codec.encode(AmqpValue("body"))
    if cut:
        payload = payload[: len(header) + max(3, len(section) - cut)]  # cut inside the properties section
    message = Message(payload)
    decoded = message.properties()
    assert message.absolute_expiry_time() == (decoded.absolute_expiry_time if decoded is not None else None)
