"""Probes of the broker's answers to flows with echo (Part 2 §2.7.4) and drains (§2.6.7), frame by frame."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Coordinator, Detach, Disposition, Flow, Source, Transfer
from minibroker.amqp.types import Symbol
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

PRODUCER, CONSUMER = 0, 1


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(BrokerSettings(), receive_timeout=5.0) as running:
        yield running


async def opened(mb: MemoryBroker, **begin: object) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open()
    await peer.begin(**begin)
    return peer


async def fill(peer: MemoryPeer, messages: int) -> None:
    await peer.attach_sender("q", PRODUCER)
    await peer.expect(Flow)
    for i in range(messages):
        await peer.transfer(PRODUCER, i, frames.message(f"m{i}"))
        assert isinstance((await peer.expect(Disposition)).state, Accepted)


async def test_a_session_flow_with_echo_is_answered_with_the_session_state(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer = await opened(mb)
    await peer.flow(None, None, echo=True)
    flow = await peer.expect(Flow)
    assert flow.handle is None
    assert flow.next_incoming_id is not None
    assert flow.incoming_window is not None
    await peer.expect_nothing()


async def test_an_echo_on_a_link_where_the_broker_receives_is_answered(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer = await opened(mb)
    attach = await peer.attach_sender("q", PRODUCER)
    first = await peer.expect(Flow)
    await peer.flow(PRODUCER, None, delivery_count=0, echo=True)
    flow = await peer.expect(Flow)
    assert (flow.handle, flow.link_credit, flow.delivery_count) == (attach.handle, first.link_credit, 0)
    await peer.expect_nothing()


async def test_an_echo_drain_on_an_empty_queue_is_one_flow(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb)
    attach = await peer.attach_receiver("q", CONSUMER)
    await peer.flow(CONSUMER, 4, delivery_count=0, drain=True, echo=True)
    flow = await peer.expect(Flow)
    assert (flow.handle, flow.delivery_count, flow.link_credit, flow.drain, flow.available) == (
        attach.handle,
        4,
        0,
        True,
        0,
    )
    await peer.expect_nothing()


async def test_a_partial_drain_leaves_the_rest_available(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb)
    await fill(peer, 3)
    await peer.attach_receiver("q", CONSUMER)
    await peer.flow(CONSUMER, 1, delivery_count=0, drain=True, echo=True)
    await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    assert (flow.delivery_count, flow.link_credit, flow.drain, flow.available) == (1, 0, True, 2)
    await peer.expect_nothing()


async def test_several_echos_in_one_write_are_each_answered(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb)
    await fill(peer, 3)
    await peer.attach_receiver("q", CONSUMER)
    flows = [peer.conn.flow(CONSUMER, 1, delivery_count=n, echo=True) for n in range(3)]
    await peer.send_raw(b"".join(frames.frame(0, f) for f in flows))
    seen = []
    for _ in range(6):
        frame = await peer.receive()
        seen.append(type(frame.performative).__name__)
        if isinstance(frame.performative, Flow):
            seen[-1] += f"({int(frame.performative.delivery_count or 0)},{int(frame.performative.available or 0)})"
    assert seen == ["Transfer", "Flow(1,2)", "Transfer", "Flow(2,1)", "Transfer", "Flow(3,0)"]
    await peer.expect_nothing()


async def test_an_echo_behind_a_closed_session_window_does_not_overtake_the_transfers(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await opened(mb)
    await fill(producer, 3)
    peer = await opened(mb, incoming_window=1)
    await peer.attach_receiver("q", CONSUMER)
    await peer.flow(CONSUMER, 3, delivery_count=0, echo=True)
    await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    # the flow must not count deliveries the broker has not sent (§2.6.7: delivery-count counts what was sent)
    assert flow.delivery_count is not None
    assert int(flow.delivery_count) + int(flow.link_credit or 0) == 3
    assert int(flow.delivery_count) == 1, flow


async def test_a_drain_behind_a_closed_session_window_leaves_the_held_transfers_their_credit(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await opened(mb)
    await fill(producer, 2)
    peer = await opened(mb, incoming_window=1)
    await peer.attach_receiver("q", CONSUMER)
    await peer.flow(CONSUMER, 5, delivery_count=0, drain=True)
    await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    # one transfer sent, one held: the drain used up 3 credits; the held transfer still has its own
    assert (flow.delivery_count, flow.link_credit, flow.drain) == (4, 1, True)
    await peer.flow(None, None, incoming_window=10)
    await peer.expect(Transfer)


async def test_an_echo_on_the_coordinator_link_is_answered(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb)
    attach = await peer.attach_sender(None, PRODUCER, name="controller", source=Source(), target=Coordinator())
    granted = await peer.expect(Flow)
    await peer.flow(PRODUCER, None, delivery_count=0, echo=True)
    flow = await peer.expect(Flow)
    assert (flow.handle, flow.link_credit, flow.available) == (attach.handle, granted.link_credit, None)
    await peer.expect_nothing()


async def test_an_echo_written_with_transfers_answers_after_them(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb)
    await peer.attach_sender("q", PRODUCER)
    await peer.expect(Flow)
    consumer = await peer.attach_receiver("q", CONSUMER)
    posts = [frames.frame(0, frames.transfer(PRODUCER, i), frames.message(f"m{i}")) for i in range(2)]
    echo = frames.frame(0, peer.conn.flow(CONSUMER, 1, delivery_count=0, echo=True))
    await peer.send_raw(b"".join([*posts, echo, frames.frame(0, frames.transfer(PRODUCER, 2), frames.message("m2"))]))
    seen: list[object] = []
    while not seen or not isinstance(seen[-1], Disposition) or seen[-1].last != 2:
        seen.append((await peer.receive()).performative)
    flows = [f for f in seen if isinstance(f, Flow)]
    assert len(flows) == 1
    assert (flows[0].handle, flows[0].delivery_count, flows[0].link_credit) == (consumer.handle, 1, 0)
    assert int(flows[0].available or 0) in (1, 2)  # m2 may or may not have arrived: both are true states
    assert [type(f).__name__ for f in seen].count("Transfer") == 1


async def test_an_echo_on_a_link_the_broker_detaches_for_that_flow_gets_the_detach_alone(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer = await opened(mb)
    await fill(peer, 1)
    await peer.attach_receiver("q", CONSUMER)
    unknown = {Symbol("txn-id"): b"no-such-txn"}
    await peer.flow(CONSUMER, 1, delivery_count=0, echo=True, properties=unknown)
    detach = await peer.expect(Detach)
    assert detach.error is not None
    await peer.flow(CONSUMER, 1, delivery_count=0, echo=True)  # sent before it saw the detach: ignored (§2.6.2)
    await peer.expect_nothing()


async def test_a_topic_subscriber_is_told_what_its_subscription_holds(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer = await opened(mb)
    await peer.attach_receiver("topic://news", CONSUMER)
    await peer.attach_sender("topic://news", PRODUCER)
    await peer.expect(Flow)
    for i in range(3):
        await peer.transfer(PRODUCER, i, frames.message(f"n{i}"))
        assert isinstance((await peer.expect(Disposition)).state, Accepted)
    await peer.flow(CONSUMER, 1, delivery_count=0, echo=True)
    await peer.expect(Transfer)
    flow = await peer.expect(Flow)
    assert (flow.delivery_count, flow.link_credit, flow.available) == (1, 0, 2)
