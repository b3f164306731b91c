"""The ``available`` of the broker's flows on the links it sends on (Part 2 §2.7.4: "the number of messages
awaiting credit at the link sender endpoint"), checked frame by frame.

The broker answers a flow with echo, and ends a drain, only after it has acted on that flow: the transfers the
credit allowed come first, then our flow, whose ``available`` is what is left on the queue (for a browser, what
lies past its cursor) and whose delivery-count and credit count those transfers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Disposition, Flow, Source, Transfer
from minibroker.amqp.types import Symbol
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

PRODUCER, CONSUMER = 0, 1


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(BrokerSettings(), receive_timeout=5.0) as running:
        yield running


async def peer_with(mb: MemoryBroker, messages: int, *, browse: bool = False) -> tuple[MemoryPeer, int]:
    """A peer that put ``messages`` on queue "q" and attached a receiver from it with no credit yet; the broker's
    handle for that receiver."""
    peer = await mb.connect()
    await peer.open()
    await peer.begin()
    await peer.attach_sender("q", PRODUCER)
    await peer.expect(Flow)
    for i in range(messages):
        await peer.transfer(PRODUCER, i, frames.message(f"m{i}"))
        assert isinstance((await peer.expect(Disposition)).state, Accepted)
    source = Source(address="q", distribution_mode=Symbol("copy") if browse else None)
    attach = await peer.attach_receiver("q", CONSUMER, source=source)
    return peer, int(attach.handle)


async def test_an_echo_is_answered_after_the_transfers_with_what_is_left(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer, handle = await peer_with(mb, 3)
    await peer.flow(CONSUMER, 1, delivery_count=0, echo=True)
    await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    assert (flow.handle, flow.delivery_count, flow.link_credit, flow.available) == (handle, 1, 0, 2)
    # no credit: nothing moves, and the answer still says what waits
    await peer.flow(CONSUMER, 0, delivery_count=1, echo=True)
    flow = await peer.expect(Flow)
    assert (flow.delivery_count, flow.link_credit, flow.available) == (1, 0, 2)
    await peer.expect_nothing()


async def test_a_drain_ends_with_nothing_available(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer, handle = await peer_with(mb, 2)
    await peer.flow(CONSUMER, 5, delivery_count=0, drain=True, echo=True)
    assert [(await peer.expect_frame(Transfer)).payload for _ in range(2)] == [
        frames.message("m0"),
        frames.message("m1"),
    ]
    flow = await peer.expect(Flow)  # one flow: it ends the drain and answers the echo
    assert (flow.handle, flow.delivery_count, flow.link_credit, flow.drain, flow.available) == (handle, 5, 0, True, 0)
    await peer.expect_nothing()


async def test_a_browser_is_told_what_lies_past_its_cursor(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer, _ = await peer_with(mb, 3, browse=True)
    await peer.flow(CONSUMER, 2, delivery_count=0, echo=True)
    for _ in range(2):
        await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    assert (flow.delivery_count, flow.link_credit, flow.available) == (2, 0, 1)
    assert mb.broker.queues["q"].depth == 3  # browsing took nothing
