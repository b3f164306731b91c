"""What the broker keeps after a scenario, counted (issue 12, items 5, 14 and 17).

- Fan-out: a publish to N subscriptions costs N small records over one shared copy of the message (bytes and
  parse), never N copies; measured with ``tracemalloc`` against a bound the copy-per-subscription code broke.
- Timers: a consumed message with a ttl is freed at once (its expiry timer holds no message, and timers that
  nothing needs any more are dropped from the heap).
- Leftovers: a rejected transfer of a link in rcv-settle-mode second, and a browsed copy left unsettled by a
  browser that detaches, are never kept by the broker.

Each test drives the real engine and core in memory over ``minibroker.testing.memory`` streams, under
``MockClock``; the broker is read through ``broker.queue(name)``-style introspection and ``tracemalloc``.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    ApplicationProperties,
    Detach,
    Disposition,
    End,
    Flow,
    Header,
    Modified,
    Rejected,
    Source,
    Transfer,
)
from minibroker.amqp.types import Described, Symbol, UInt
from minibroker.broker.core import BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.broker.topic import Topic
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

DAY_MS = 86_400_000
BIG = 10_000  # bytes of body: any message kept shows in the totals


@pytest.fixture
def settings() -> BrokerSettings:
    return BrokerSettings()


@pytest.fixture
async def mb(settings: BrokerSettings) -> AsyncIterator[MemoryBroker]:
    async with memory_broker(settings, receive_timeout=10.0) as running:
        yield running


async def peer_of(mb: MemoryBroker, name: str = "peer", **begin: Any) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open(container_id=name)
    await peer.begin(**begin)
    return peer


class Traced:
    """Bytes allocated (and still held) since the block began."""

    grown = 0


@contextmanager
def traced() -> Iterator[Traced]:
    result = Traced()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        yield result
        gc.collect()
        result.grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


async def drain_transfers(peer: MemoryPeer, count: int) -> list[int]:
    """Receive ``count`` transfers (skipping other frames); their delivery ids. The peer forgets the frames (it
    keeps every frame it received, for its error messages: here they would count as held)."""
    ids: list[int] = []
    while len(ids) < count:
        frame = await peer.receive()
        if isinstance(frame.performative, Transfer):
            ids.append(frame.performative.delivery_id or 0)
    peer.received.clear()
    return ids


# -- fan-out (item 5) -------------------------------------------------------------------------------------------
SUBSCRIPTIONS = 2000
PUBLISHES = 4


async def subscribe_many(mb: MemoryBroker, count: int) -> MemoryPeer:
    """One connection with ``count`` subscriptions of topic ``news`` (links without credit: copies stay)."""
    peer = await peer_of(mb, "subscriber")
    per_session = 1000
    for channel in range(1, (count + per_session - 1) // per_session):
        await peer.begin(channel=channel)
    for n in range(count):
        channel, handle = divmod(n, per_session)
        await peer.send(frames.attach_receiver("topic://news", handle, f"sub-{n}"), channel=channel)
    for _ in range(count):
        await peer.expect(frames.Attach)
    return peer


@pytest.mark.parametrize(
    "settings", [BrokerSettings(max_subscriptions_per_topic=5000, max_subscriptions_per_connection=5000)]
)
async def test_publish_to_many_subscriptions_shares_one_copy(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    await subscribe_many(mb, SUBSCRIPTIONS)
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("topic://news", 0, name="p")
    await producer.expect(Flow)
    body = frames.message("x" * 180)  # about 200 bytes
    await producer.transfer(0, 0, body)  # the first publish sets up each subscription's lists: not measured
    await producer.expect(Disposition)
    with traced() as memory:
        for n in range(1, PUBLISHES + 1):
            await producer.transfer(0, n, body)
            assert isinstance((await producer.expect(Disposition)).state, Accepted)
        await mb.settle()
    per_copy = memory.grown / (PUBLISHES * SUBSCRIPTIONS)
    # one record per subscription (about 90 bytes with its place in the queue), never a copy of the message and
    # of its parse (the copy-per-subscription code kept about 300 bytes each)
    assert per_copy < 150, f"{per_copy:.0f} bytes kept per subscription and publish"
    topic = mb.broker.topics["news"]
    assert isinstance(topic, Topic)
    copies = [m for s in topic.subscriptions.values() for m in s.ready]
    assert len(copies) == SUBSCRIPTIONS * (PUBLISHES + 1)
    last = [s.ready[-1] for s in topic.subscriptions.values()]
    assert all(m.content is last[0].content for m in last)  # one content, one payload, for every copy


async def test_copies_of_one_publish_differ_only_in_what_is_theirs(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    subscriber = await peer_of(mb, "subscriber")
    for handle in range(2):
        await subscriber.attach_receiver("topic://news", handle, name=f"s{handle}")
        await subscriber.flow(handle=handle, link_credit=1, delivery_count=0)
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("topic://news", 0, name="p")
    await producer.expect(Flow)
    await producer.transfer(0, 0, frames.message("shared", Header(delivery_count=UInt(2))))
    await producer.expect(Disposition)
    first, second = await drain_transfers(subscriber, 2)
    await subscriber.disposition(first, state=Modified(delivery_failed=True, message_annotations={Symbol("x-a"): 1}))
    await mb.settle()
    (a, b) = [s for s in mb.broker.topics["news"].subscriptions.values()]
    held = [*a.ready, *b.ready]
    assert len(held) == 1  # the other copy is still out, unsettled
    assert (held[0].delivery_count, held[0].annotation("x-a")) == (3, 1)
    consumers = mb.broker.dispatcher.consumers_of(mb.tasks[0].engine)
    (other,) = [d.message for c in consumers for d in c.unsettled.values()]
    assert (other.delivery_count, other.annotation("x-a")) == (2, None)
    assert other.payload is not held[0].payload  # the annotated copy got bytes of its own
    del second


@pytest.mark.parametrize("settings", [BrokerSettings(max_selector_properties_size=1000)])
async def test_subscription_selectors_read_no_oversized_section(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """The copies' shared parse is bounded as any selector's is (``max_selector_properties_size``)."""
    subscriber = await peer_of(mb, "subscriber")
    for handle, text in enumerate(["color = 'red'", "NOT (color = 'red')", None]):
        selector = {Symbol("jms"): Described(Symbol("apache.org:selector-filter:string"), text)} if text else None
        source = Source(address="topic://paint", filter=selector)
        await subscriber.attach_receiver("topic://paint", handle, name=f"s{handle}", source=source)
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("topic://paint", 0, name="p")
    await producer.expect(Flow)
    small = frames.message("small", ApplicationProperties({"color": "red"}))
    big = frames.message("big", ApplicationProperties({"color": "red", "pad": "x" * 2000}))
    for n, payload in enumerate([small, big]):
        await producer.transfer(0, n, payload, settled=True)
    await mb.settle()
    red, not_red, everything = (s.depth for s in mb.topic("paint").subscriptions())
    assert (red, not_red, everything) == (1, 0, 2)


# -- ttl timers (item 14) ---------------------------------------------------------------------------------------
async def test_consumed_message_with_a_ttl_is_freed_at_once(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    count = 200
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("ttl", 0, name="p")
    await producer.expect(Flow)
    consumer = await peer_of(mb, "consumer")
    await consumer.attach_receiver("ttl", 0, name="c")
    with traced() as memory:
        for n in range(count):
            payload = frames.message("x" * BIG, Header(ttl=UInt(DAY_MS)))
            await producer.transfer(0, n, payload, settled=True)
        await mb.settle()
        assert mb.queue("ttl").depth == count
        await consumer.flow(handle=0, link_credit=count, delivery_count=0)
        ids = await drain_transfers(consumer, count)
        await consumer.disposition(ids[0], ids[-1], state=Accepted())
        await mb.settle()
        assert mb.queue("ttl").acquired == 0
    # 200 x 10 kB consumed: nothing of them may stay for the day their ttl runs (it used to be all of them)
    assert memory.grown < count * BIG // 20, f"{memory.grown} bytes kept after consuming every message"
    timers = mb.broker.dispatcher.timers
    assert len(timers) <= count  # entries without a message: dropped as they pile up
    for _ in range(2):  # a day later the heap is empty and the timer is idle
        await trio.sleep(43_201)
    assert len(timers) == 0


async def test_expiry_timers_of_consumed_messages_do_not_pile_up(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("ttl", 0, name="p")
    await producer.expect(Flow)
    consumer = await peer_of(mb, "consumer", incoming_window=1 << 20)
    await consumer.attach_receiver("ttl", 0, name="c", snd_settle_mode=UInt(1))  # pre-settled: consumed at once
    await consumer.flow(handle=0, link_credit=100_000, delivery_count=0, incoming_window=1 << 20)
    for n in range(3000):
        await producer.transfer(0, n, frames.message("m", Header(ttl=UInt(DAY_MS))), settled=True)
        if n % 500 == 499:
            await drain_transfers(consumer, 500)
    await mb.settle()
    assert mb.queue("ttl").depth == 0
    assert len(mb.broker.dispatcher.timers) < 1000  # rebuilt without the dead ones, not 3000 entries


async def test_expiry_still_expires_every_copy(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    subscriber = await peer_of(mb, "subscriber")
    for handle in range(3):
        await subscriber.attach_receiver("topic://t", handle, name=f"s{handle}")
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("topic://t", 0, name="p")
    await producer.expect(Flow)
    await producer.transfer(0, 0, frames.message("short", Header(ttl=UInt(1000))), settled=True)
    await producer.transfer(0, 1, frames.message("long", Header(ttl=UInt(60_000))), settled=True)
    await mb.settle()
    topic = mb.topic("t")
    assert [s.depth for s in topic.subscriptions()] == [2, 2, 2]
    assert len(mb.broker.dispatcher.timers) == 2  # one timer per publish, not per copy
    await trio.sleep(2)
    assert [s.depth for s in topic.subscriptions()] == [1, 1, 1]
    await trio.sleep(60)
    assert [s.depth for s in topic.subscriptions()] == [0, 0, 0]


# -- leftovers (item 17) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(queues={"full": NodePolicy(max_messages=1)})])
@pytest.mark.parametrize("ending", ["settled", "detach", "end", "close"])
async def test_rejected_transfers_in_rcv_settle_mode_second_are_not_kept(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    count = 100
    peer = await peer_of(mb, "sender")
    await peer.attach_sender("full", 0, name="second", rcv_settle_mode=UInt(1))
    await peer.expect(Flow)
    await peer.transfer(0, 0, frames.message("fills it"))
    await peer.expect(Disposition)
    with traced() as memory:
        for n in range(1, count + 1):
            await peer.transfer(0, n, frames.message("x" * BIG))
            answer = await peer.expect(Disposition)
            assert isinstance(answer.state, Rejected)
            assert not answer.settled  # rcv-settle-mode second: the broker waits for our settlement
            peer.received.clear()
        if ending == "settled":
            await peer.disposition(0, count, role=False, settled=True, state=answer.state)
        elif ending == "detach":
            await peer.send(Detach(handle=UInt(0), closed=True))
            await peer.expect(Detach)
        elif ending == "end":
            await peer.send(End())
            await peer.expect(End)
        else:
            await peer.close()
        await mb.settle()
    assert mb.queue("full").depth == 1
    assert memory.grown < count * BIG // 20, f"{memory.grown} bytes kept for {count} rejected transfers"
    if ending in ("settled", "end", "close"):  # nothing at all is waiting for a settlement any more
        sessions = [] if ending == "close" else list(mb.tasks[-1].engine.sessions.values())
        assert all(not s.incoming_unsettled for s in sessions)


@pytest.mark.parametrize("ending", ["detach", "close"])
async def test_browsed_copies_left_unsettled_are_not_kept_after_the_browser_goes(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    count = 50
    producer = await peer_of(mb, "producer")
    await producer.attach_sender("browsed", 0, name="p")
    await producer.expect(Flow)
    with traced() as memory:
        for n in range(count):
            await producer.transfer(0, n, frames.message("x" * BIG), settled=True)
        browser = await peer_of(mb, "browser")
        copy = Source(address="browsed", distribution_mode=Symbol("copy"))
        await browser.attach_receiver("browsed", 0, name="b", source=copy)
        await browser.flow(handle=0, link_credit=count, delivery_count=0)
        await drain_transfers(browser, count)  # never settled
        browsed = mb.queue("browsed").stats()
        assert (browsed.depth, browsed.acquired) == (count, 0)  # browsing takes nothing
        if ending == "detach":
            await browser.send(Detach(handle=UInt(0), closed=True))
            await browser.expect(Detach)
        else:
            await browser.close()
        await mb.settle()
        assert mb.queue("browsed").purge() == count
        await mb.settle()
    assert memory.grown < count * BIG // 10, f"{memory.grown} bytes kept after the browser went"
