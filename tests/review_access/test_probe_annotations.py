"""Probes: string keys in message-annotations (issue 12, "from real clients"; README "Compatibility": "a
symbol-keyed map (... annotations) whose keys are strings ... is taken with its keys made symbols ... Keys of
other types are still `amqp:decode-error`").

A message whose message-annotations hold a key no symbol can be (a non-ASCII string, an int) fails to decode
in ``Content``; the broker then forgets the header it had already read (durable, ttl, priority, delivery-count)
and takes the message anyway: a durable message is acknowledged without being journaled, and a message the
broker re-encodes (``modified``, dead-lettering) gets a second header in front of the first.
"""

from __future__ import annotations

from pathlib import Path

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Header
from minibroker.amqp.types import Described, ULong
from minibroker.broker.message import Message
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.server.test_durability import answer


def annotated(key: object, *, durable: bool = True) -> bytes:
    """A header, message-annotations ``{key: 1}`` encoded as given (a str key as a string), an amqp-value body."""
    annotations = codec.encode(Described(ULong(0x72), {key: 1}))
    return codec.encode(Header(durable=durable)) + annotations + codec.encode(AmqpValue("order"))


_SECTIONS = {
    0x70: "Header",
    0x71: "DeliveryAnnotations",
    0x72: "MessageAnnotations",
    0x73: "Properties",
    0x74: "ApplicationProperties",
    0x75: "Data",
    0x76: "AmqpSequence",
    0x77: "AmqpValue",
    0x78: "Footer",
}


def sections(payload: bytes) -> list[str]:
    """The section names of an encoded message, in order (each a small-ulong descriptor, read without
    building the section, so a malformed one does not stop the count)."""
    found, pos = [], 0
    while pos < len(payload):
        assert payload[pos : pos + 2] == b"\x00\x53", f"not a section at {pos}: {payload[pos : pos + 3]!r}"
        found.append(_SECTIONS.get(payload[pos + 2], hex(payload[pos + 2])))
        pos = codec.decode(payload, pos + 3)[1]
    return found


async def test_a_durable_message_with_a_non_ascii_annotation_key_is_not_acknowledged_unjournaled(
    tmp_path: Path,
) -> None:
    """Either refused (the annotations are malformed) or journaled: never ``accepted`` and then lost."""
    async with memory_broker(data_dir=tmp_path) as mb:
        producer = await client(mb)
        await producer.sender("orders", 0)
        await producer.post(0, annotated("clé"))
        state = await answer(producer)
    if not isinstance(state, Accepted):
        return  # refused: nothing was promised
    async with memory_broker(data_dir=tmp_path) as mb:
        queue = mb.queue("orders")
        assert queue.exists, "an accepted durable message was lost on restart"
        assert queue.depth == 1, "an accepted durable message was lost on restart"


def test_a_message_with_a_non_ascii_annotation_key_keeps_one_header_when_re_encoded() -> None:
    """``modified(delivery-failed)`` bumps the delivery-count: the message must still have one header, first."""
    message = Message(annotated("clé"))
    message.delivery_count += 1
    assert sections(message.encoded()).count("Header") == 1, sections(message.encoded())


def test_dead_lettering_a_message_with_an_int_annotation_key_keeps_it_well_formed() -> None:
    """Dead-lettering adds annotations: the header must stay the first section (§3.2)."""
    message = Message(annotated(7))
    message.annotate({"x-opt-dead-letter-reason": "rejected"})
    found = sections(message.payload)
    assert found[0] == "Header", found
    assert found.count("Header") == 1, found
