"""``Content.properties_at``: the place of the properties section, found while the sections before it are read
(Part 3 §3.2: header, delivery-annotations, message-annotations, properties, in that order), and
``Message.absolute_expiry_time`` read through it (issue 19), for every combination of the sections before it."""

from __future__ import annotations

import itertools

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    DeliveryAnnotations,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp.types import Symbol, Timestamp, UByte
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
    at = message.content.properties_at
    if properties == "none":
        assert at == -1
        assert message.properties() is None
    else:
        assert payload[at] in (0xC0, 0xD0, 0x45)  # the properties' list constructor
        assert message.properties() is not None
    assert message.absolute_expiry_time() == (1_700_000_000_123 if properties == "with-expiry" else None)


def test_a_malformed_message_is_looked_at_from_its_first_byte() -> None:
    """Annotations that do not decode: the message is malformed (and refused), its sections read from its first
    byte, where no properties section starts, so it has no absolute expiry (as before issue 19)."""
    broken = b"\x00\x53\x72\xc1\x03\x02\xa1"  # message-annotations: a map whose key runs past the end
    message = Message(broken + codec.encode(Properties(absolute_expiry_time=Timestamp(5))))
    assert message.malformed is not None
    assert message.content.properties_at == -1
    assert message.absolute_expiry_time() is None
