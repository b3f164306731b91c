"""Probes of the message-section walker (``amqp/sections.py``) at the frame level: sections written with the ulong
or the symbolic descriptor (Part 1 §1.2: either may be used) are read alike, and coordinator messages (Part 4
§4.5) that carry no declare or discharge in an amqp-value are refused with amqp:decode-error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    ApplicationProperties,
    Data,
    Declare,
    Declared,
    Disposition,
    Flow,
    Footer,
    Header,
    Properties,
    Rejected,
    Source,
    Transfer,
)
from minibroker.amqp.types import Described, Symbol, UByte, UInt
from minibroker.broker.core import BrokerSettings
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker
from tests.broker.test_transactions_frames import client

PRODUCER, CONSUMER = 0, 1
FORMS = ("compact", "ulong", "symbol")


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(BrokerSettings(), receive_timeout=5.0) as running:
        yield running


def encoded(section: Any, form: str) -> bytes:
    """``section`` with its descriptor in ``form``: the compact smallulong, a full ulong, or the symbol."""
    compact = codec.encode(section)
    assert compact[:2] == b"\x00\x53"
    if form == "compact":
        return compact
    if form == "ulong":
        return b"\x00\x80" + compact[2].to_bytes(8, "big") + compact[3:]
    name = section.DESCRIPTOR_NAME.encode()
    return b"\x00\xa3" + bytes([len(name)]) + name + compact[3:]


@pytest.mark.parametrize("form", FORMS)
async def test_routing_and_selectors_read_every_descriptor_form(
    mb: MemoryBroker, autojump_clock: MockClock, form: str
) -> None:
    peer = await mb.connect()
    await peer.open()
    await peer.begin()
    selector = {Symbol("s"): Described(Symbol("apache.org:selector-filter:string"), "color = 'red'")}
    await peer.attach_receiver("q", CONSUMER, source=Source(address="q", filter=selector))
    await peer.attach_sender(None, PRODUCER)  # the anonymous relay: routed by properties.to
    await peer.expect(Flow)
    sent = []
    for i, (color, ttl) in enumerate((("red", 1000), ("blue", None), ("red", None))):
        payload = b"".join(
            encoded(section, form)
            for section in (
                Header(priority=UByte(9), ttl=UInt(ttl) if ttl else None),
                Properties(to="q", subject="s"),
                ApplicationProperties({"color": color}),
                AmqpValue(f"body-{i}"),
            )
        )
        sent.append(payload)
        await peer.transfer(PRODUCER, i, payload)
        assert isinstance((await peer.expect(Disposition)).state, Accepted)
    await trio.sleep(2)  # the first one's ttl runs out
    await peer.flow(CONSUMER, 3, delivery_count=0)
    frame = await peer.expect_frame(Transfer)
    assert frame.payload == sent[2]  # the one that is red and alive, forwarded as written
    await peer.expect_nothing()
    assert mb.queue("q").depth == 1  # the blue one waits for another consumer


async def controller(mb: MemoryBroker) -> MemoryPeer:
    c = await client(mb)
    await c.coordinator(5)
    return c.peer


@pytest.mark.parametrize("form", FORMS)
async def test_a_declare_in_any_descriptor_form_with_a_footer_is_declared(
    mb: MemoryBroker, autojump_clock: MockClock, form: str
) -> None:
    peer = await controller(mb)
    payload = encoded(AmqpValue(Declare()), form) + encoded(Footer({Symbol("x"): 1}), form)
    await peer.transfer(5, 0, payload)
    assert isinstance((await peer.expect(Disposition)).state, Declared)


@pytest.mark.parametrize(
    "payload",
    [
        codec.encode(Data(codec.encode(Declare()))),  # a data body
        codec.encode(Declare()),  # a declare that is no section
        encoded(AmqpValue(Declare()), "compact")[:-1],  # cut short
        b"\x40" + codec.encode(AmqpValue(Declare())),  # a value that is not described before it
        b"",
    ],
)
async def test_a_coordinator_message_without_an_amqp_value_declare_is_a_decode_error(
    mb: MemoryBroker, autojump_clock: MockClock, payload: bytes
) -> None:
    peer = await controller(mb)
    await peer.transfer(5, 0, payload)
    state = (await peer.expect(Disposition)).state
    assert isinstance(state, Rejected)
    assert state.error is not None
    assert str(state.error.condition) == "amqp:decode-error"


@pytest.mark.parametrize(
    ("properties", "condition"),
    [
        (b"\x00\x53\x73\xc0\x05\x02\xa1\xff", "amqp:decode-error"),  # a string running past the end
        # past the limit: never decoded, as if absent (tests/review_i12_core/test_probe_sections_decoded_on_arrival)
        (encoded(Properties(to="q", subject="s" * 300), "symbol"), "amqp:not-found"),
    ],
)
async def test_the_relay_says_why_it_cannot_read_the_address(properties: bytes, condition: str) -> None:
    async with memory_broker(BrokerSettings(max_selector_properties_size=256)) as mb:
        peer = await mb.connect()
        await peer.open()
        await peer.begin()
        await peer.attach_sender(None, PRODUCER)
        await peer.expect(Flow)
        await peer.transfer(PRODUCER, 0, properties + codec.encode(AmqpValue("x")))
        state = (await peer.expect(Disposition)).state
        assert isinstance(state, Rejected)
        assert state.error is not None
        assert str(state.error.condition) == condition, state.error
